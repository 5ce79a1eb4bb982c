package cuda

import "fmt"

// PeerReport describes one pair of GPUs: whether each reaches the
// other's memory directly (staging copies replicas between them device to
// device only if both do) and what joins them.
type PeerReport struct {
	A        int    `json:"a"` // ordinals
	B        int    `json:"b"`
	AtoB     bool   `json:"a_to_b"`              // cuDeviceCanAccessPeer(A, B)
	BtoA     bool   `json:"b_to_a"`              // cuDeviceCanAccessPeer(B, A)
	PerfRank int    `json:"perf_rank,omitempty"` // cuDeviceGetP2PAttribute PERFORMANCE_RANK, A to B
	Link     string `json:"link"`                // "NV18", "NV18 through NVSwitch", "PCIe or unknown (why)"
	Error    string `json:"error,omitempty"`
}

// Access says whether replicas are copied device to device between the
// pair (both directions reach).
func (p PeerReport) Access() bool { return p.AtoB && p.BtoA }

// Summary is the pair in one line: access and link.
func (p PeerReport) Summary() string {
	access := "peer access both ways"
	switch {
	case p.Error != "":
		access = "peer access unknown (" + p.Error + "): replicas are staged from host"
	case !p.Access():
		access = fmt.Sprintf("no peer access (%d->%d %v, %d->%d %v): replicas are staged from host", p.A, p.B, p.AtoB, p.B, p.A, p.BtoA)
	}
	return access + ", link " + p.Link
}

// nvlinks is what NVML says joins two GPUs.
type nvlinks struct {
	direct           int  // links from A that end at B
	switchA, switchB int  // links of each that end at an NVSwitch
	p2p              bool // nvmlDeviceGetP2PStatus(NVLINK) is OK
}

// String is the link as nvidia-smi topo names it, with how it was found.
func (l nvlinks) String() string {
	switch {
	case l.direct > 0:
		return fmt.Sprintf("NV%d", l.direct)
	case l.switchA > 0 && l.switchB > 0:
		return fmt.Sprintf("NV%d through NVSwitch", min(l.switchA, l.switchB))
	case l.p2p:
		return "NVLink (link count unknown)"
	}
	return "PCIe or unknown (NVML finds no NVLink between them)"
}

// checkPeers reports every pair of the devices queried.
func checkPeers(infos []deviceInfo) []PeerReport {
	out := []PeerReport{}
	for i := range infos {
		for j := i + 1; j < len(infos); j++ {
			out = append(out, checkPair(infos[i], infos[j]))
		}
	}
	return out
}

func checkPair(a, b deviceInfo) PeerReport {
	p := PeerReport{A: a.ordinal, B: b.ordinal}
	ca, cb := devContext(a), devContext(b)
	var err error
	if p.AtoB, err = canAccessPeer(ca, cb); err == nil {
		p.BtoA, err = canAccessPeer(cb, ca)
	}
	if err != nil {
		p.Error = err.Error()
	}
	if rank, err := p2pRank(ca, cb); err == nil {
		p.PerfRank = rank
	}
	l, err := nvmlLinks(formatUUID(a.uuid), formatUUID(b.uuid))
	if err != nil {
		p.Link = "PCIe or unknown (NVML: " + err.Error() + ")"
	} else {
		p.Link = l.String()
	}
	return p
}
