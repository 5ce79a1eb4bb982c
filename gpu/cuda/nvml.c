//go:build cgo

/*
 * nvml.c: how many NVLinks join two GPUs, from libnvidia-ml.so.1 loaded
 * with dlopen (optional: `gdsfs check` says "PCIe or unknown" without it).
 * Only what the topology report needs: the GPU's active links, where each
 * one ends (a GPU, by PCI address, or an NVSwitch), and NVML's own word on
 * NVLink peer-to-peer between the pair.
 *
 * Types and values checked against public copies of nvml.h:
 * nvmlPciInfo_t {char busIdLegacy[16]; unsigned domain, bus, device,
 * pciDeviceId, pciSubSystemId; char busId[32]} (68 bytes),
 * NVML_P2P_CAPS_INDEX_NVLINK = 2, NVML_P2P_STATUS_OK = 0,
 * NVML_NVLINK_DEVICE_TYPE_GPU = 0, _SWITCH = 2, NVML_FEATURE_ENABLED = 1,
 * NVML_NVLINK_MAX_LINKS = 18 (the sweep goes further and skips errors).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "shim.h"

typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct {
	char busIdLegacy[16];
	unsigned int domain;
	unsigned int bus;
	unsigned int device;
	unsigned int pciDeviceId;
	unsigned int pciSubSystemId;
	char busId[32];
} nvmlPciInfo_t;

_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t size");
_Static_assert(offsetof(nvmlPciInfo_t, domain) == 16, "nvmlPciInfo_t.domain");

#define NVML_SUCCESS 0
#define NVML_FEATURE_ENABLED 1
#define NVML_P2P_CAPS_INDEX_NVLINK 2
#define NVML_P2P_STATUS_OK 0
#define NVML_NVLINK_DEVICE_TYPE_GPU 0
#define NVML_NVLINK_DEVICE_TYPE_SWITCH 2
#define LINK_SWEEP 32

static struct {
	int tried, ok;
	char err[256];
	int (*Init)(void);
	int (*ByUUID)(const char *uuid, nvmlDevice_t *dev);
	int (*PciInfo)(nvmlDevice_t dev, nvmlPciInfo_t *pci);
	int (*LinkState)(nvmlDevice_t dev, unsigned int link, int *active);
	int (*RemotePci)(nvmlDevice_t dev, unsigned int link, nvmlPciInfo_t *pci);
	int (*RemoteType)(nvmlDevice_t dev, unsigned int link, int *type); /* optional */
	int (*P2PStatus)(nvmlDevice_t a, nvmlDevice_t b, int caps, int *status);
} nv;

static void *nvsym(void *lib, const char *a, const char *b)
{
	void *p = dlsym(lib, a);
	if (p == NULL && b != NULL)
		p = dlsym(lib, b);
	if (p == NULL && nv.err[0] == 0)
		snprintf(nv.err, sizeof(nv.err), "libnvidia-ml.so.1: symbol %s not found", a);
	return p;
}

/* nvml_load loads and initialises NVML once; it stays loaded. */
static int nvml_load(void)
{
	if (nv.tried)
		return nv.ok ? 0 : -1;
	nv.tried = 1;
	void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL) {
		const char *e = dlerror();
		snprintf(nv.err, sizeof(nv.err), "dlopen libnvidia-ml.so.1: %s", e ? e : "unknown error");
		return -1;
	}
	nv.Init = nvsym(lib, "nvmlInit_v2", "nvmlInit");
	nv.ByUUID = nvsym(lib, "nvmlDeviceGetHandleByUUID", NULL);
	nv.PciInfo = nvsym(lib, "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2");
	nv.LinkState = nvsym(lib, "nvmlDeviceGetNvLinkState", NULL);
	nv.RemotePci = nvsym(lib, "nvmlDeviceGetNvLinkRemotePciInfo_v2", "nvmlDeviceGetNvLinkRemotePciInfo");
	nv.P2PStatus = nvsym(lib, "nvmlDeviceGetP2PStatus", NULL);
	nv.RemoteType = dlsym(lib, "nvmlDeviceGetNvLinkRemoteDeviceType");
	if (nv.Init == NULL || nv.ByUUID == NULL || nv.PciInfo == NULL || nv.LinkState == NULL ||
	    nv.RemotePci == NULL || nv.P2PStatus == NULL)
		return -1;
	int r = nv.Init();
	if (r != NVML_SUCCESS) {
		snprintf(nv.err, sizeof(nv.err), "nvmlInit: error %d", r);
		return -1;
	}
	nv.ok = 1;
	return 0;
}

static int same_pci(const nvmlPciInfo_t *a, const nvmlPciInfo_t *b)
{
	return a->domain == b->domain && a->bus == b->bus && a->device == b->device;
}

/* links counts dev's active links that reach peer (a GPU at peer_pci) and
 * those that reach an NVSwitch. */
static void links(nvmlDevice_t dev, const nvmlPciInfo_t *peer_pci, int *direct, int *switched)
{
	for (unsigned int l = 0; l < LINK_SWEEP; l++) {
		int active = 0;
		if (nv.LinkState(dev, l, &active) != NVML_SUCCESS || active != NVML_FEATURE_ENABLED)
			continue;
		int type = -1;
		if (nv.RemoteType != NULL && nv.RemoteType(dev, l, &type) == NVML_SUCCESS &&
		    type == NVML_NVLINK_DEVICE_TYPE_SWITCH) {
			(*switched)++;
			continue;
		}
		nvmlPciInfo_t remote;
		memset(&remote, 0, sizeof(remote));
		if (nv.RemotePci(dev, l, &remote) == NVML_SUCCESS && same_pci(&remote, peer_pci))
			(*direct)++;
	}
}

int gds_nvml_links(const char *uuid_a, const char *uuid_b, int *direct, int *switch_a, int *switch_b,
		   int *nvlink_p2p, char *err, size_t errlen)
{
	*direct = *switch_a = *switch_b = *nvlink_p2p = 0;
	if (nvml_load() != 0) {
		snprintf(err, errlen, "%s", nv.err);
		return -1;
	}
	nvmlDevice_t a, b;
	nvmlPciInfo_t pa, pb;
	memset(&pa, 0, sizeof(pa));
	memset(&pb, 0, sizeof(pb));
	int r = nv.ByUUID(uuid_a, &a);
	if (r == NVML_SUCCESS)
		r = nv.ByUUID(uuid_b, &b);
	if (r == NVML_SUCCESS)
		r = nv.PciInfo(a, &pa);
	if (r == NVML_SUCCESS)
		r = nv.PciInfo(b, &pb);
	if (r != NVML_SUCCESS) {
		snprintf(err, errlen, "nvmlDeviceGetHandleByUUID/PciInfo: error %d", r);
		return -1;
	}
	int unused = 0;
	links(a, &pb, direct, switch_a);
	links(b, &pa, &unused, switch_b);
	int status = -1;
	if (nv.P2PStatus(a, b, NVML_P2P_CAPS_INDEX_NVLINK, &status) == NVML_SUCCESS)
		*nvlink_p2p = status == NVML_P2P_STATUS_OK;
	return 0;
}
