package access

import "unsafe"

func unsafePointer(g []uint32) unsafe.Pointer { return unsafe.Pointer(&g[0]) }
