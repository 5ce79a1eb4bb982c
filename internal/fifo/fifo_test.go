package fifo

import "testing"

func TestQueueOrder(t *testing.T) {
	var q Queue[int]
	if !q.MayGo(1) {
		t.Fatal("an empty line must let anyone go")
	}
	if _, ok := q.Front(); ok {
		t.Fatal("an empty line has a front")
	}
	for _, r := range []int{1, 2, 3} {
		if !q.Join(r) {
			t.Fatalf("%d did not join", r)
		}
	}
	if q.Join(2) || q.Len() != 3 {
		t.Fatalf("2 joined twice: %d in line", q.Len())
	}
	if q.MayGo(2) || !q.MayGo(1) || q.MayGo(4) {
		t.Fatal("only the first may go while anyone waits")
	}
	if !q.Leave(1) || q.Leave(1) {
		t.Fatal("1 left twice or not at all")
	}
	if f, ok := q.Front(); !ok || f != 2 || !q.MayGo(2) {
		t.Fatalf("front %d %v, want 2", f, ok)
	}
	q.Leave(3)
	q.Leave(2)
	if q.Len() != 0 || q.Has(2) || !q.MayGo(9) {
		t.Fatal("the line is not empty after everyone left")
	}
}
