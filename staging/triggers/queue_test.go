package triggers

import (
	"context"
	"errors"
	"slices"
	"testing"
)

func TestOfferDropsDuplicatesAndWhatDoesNotFit(t *testing.T) {
	q := NewQueue(2, 1, nil)
	for _, c := range []struct {
		rel       string
		on        []string
		afterRead bool
		ok, added bool
	}{
		{"a", nil, false, true, true},
		{"a", nil, false, true, false},              // the same request
		{"a", []string{"host0"}, false, true, true}, // other devices: another request
		{"a", nil, true, false, false},              // a staging after a read is another request, and the queue is full
		{"a", nil, false, true, false},              // still a duplicate, full or not
	} {
		ok, added := q.Offer(c.rel, c.on, c.afterRead)
		if ok != c.ok || added != c.added {
			t.Errorf("Offer(%q, %q, %v) = %v, %v; want %v, %v", c.rel, c.on, c.afterRead, ok, added, c.ok, c.added)
		}
	}
	if n := q.Len(); n != 2 {
		t.Errorf("Len = %d, want 2", n)
	}
}

// A request counts as queued until done calls forget, and can be queued
// again after.
func TestARequestIsQueuedUntilForgotten(t *testing.T) {
	q := NewQueue(4, 1, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); q.Wait() }()
	type end struct {
		rel    string
		on     []string
		err    error
		forget func()
	}
	staged, ended := make(chan string), make(chan end)
	fail := errors.New("no such file")
	q.Run(ctx, func(_ context.Context, rel string, _ []string, afterRead bool) error {
		staged <- rel
		if afterRead {
			return nil
		}
		return fail
	}, func(rel string, on []string, _ bool, err error, forget func()) {
		ended <- end{rel, on, err, forget}
	})
	q.Offer("f", []string{"host0"}, false)
	if rel := <-staged; rel != "f" {
		t.Fatalf("staged %q, want f", rel)
	}
	e := <-ended
	if e.rel != "f" || !slices.Equal(e.on, []string{"host0"}) || !errors.Is(e.err, fail) {
		t.Fatalf("done(%q, %q, %v), want f, [host0], %v", e.rel, e.on, e.err, fail)
	}
	if _, added := q.Offer("f", []string{"host0"}, false); added {
		t.Fatal("queued again before its end was forgotten")
	}
	e.forget()
	if n := q.Len(); n != 0 {
		t.Fatalf("Len after forget = %d, want 0", n)
	}
	if _, added := q.Offer("f", []string{"host0"}, false); !added {
		t.Fatal("not queued again after its end was forgotten")
	}
	<-staged
	(<-ended).forget()
}
