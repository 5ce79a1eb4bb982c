/*
 * A stand-in libcufile.so.0 for the statistics tests: the entry points
 * gdsfs resolves, and (unless built with -DNO_STATS) the statistics API
 * with canned counters. The counters are written at the byte offsets of
 * NVIDIA's cufile.h layout, worked out here independently of shim.h:
 *   CUfileStatsLevel1_t: read_ops {ok, err} at 0 and 8, read_bytes at 96;
 *   CUfileStatsLevel3_t: num_gpus (u32) at 1024, per_gpu_stats[16] at
 *   1032, 248 bytes each: uuid[16] at 0, read_bytes 16, n_total_reads 48,
 *   n_p2p_reads 56, n_nvfs_reads 64, n_posix_reads 72, n_reads_err 112.
 * GetStats fails unless SetStatsLevel(3) and StatsStart came first.
 */
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

typedef struct {
	int err;
	int cu_err;
} status;

static const status ok = {0, 0};
static const status invalid = {5022, 0}; /* CU_FILE_INVALID_VALUE */

status cuFileDriverOpen(void) { return ok; }
status cuFileDriverClose(void) { return ok; }
status cuFileHandleRegister(void **fh, void *descr) { (void)descr; *fh = 0; return ok; }
void cuFileHandleDeregister(void *fh) { (void)fh; }
status cuFileBufRegister(const void *p, size_t n, int flags) { (void)p; (void)n; (void)flags; return ok; }
status cuFileBufDeregister(const void *p) { (void)p; return ok; }
ssize_t cuFileRead(void *fh, void *p, size_t n, off_t f, off_t b) { (void)fh; (void)p; (void)f; (void)b; return (ssize_t)n; }

#ifndef NO_STATS
static int level, started;

static void put64(void *base, size_t off, uint64_t v) { memcpy((char *)base + off, &v, sizeof(v)); }

status cuFileSetStatsLevel(int l)
{
	if (l < 0 || l > 3)
		return invalid;
	level = l;
	return ok;
}

status cuFileStatsStart(void)
{
	started = 1;
	return ok;
}

status cuFileGetStatsL1(void *s)
{
	if (!started || level < 1)
		return invalid;
	memset(s, 0, 512);
	put64(s, 0, 1030);          /* read_ops.ok */
	put64(s, 8, 2);             /* read_ops.err */
	put64(s, 96, 4294967296 + 40960); /* read_bytes */
	return ok;
}

status cuFileGetStatsL3(void *s)
{
	if (!started || level != 3)
		return invalid;
	memset(s, 0, 5000);
	cuFileGetStatsL1(s);
	uint32_t n = 2;
	memcpy((char *)s + 1024, &n, sizeof(n));
	char *g0 = (char *)s + 1032, *g1 = g0 + 248;
	for (int i = 0; i < 16; i++)
		g0[i] = (char)(0xa0 + i);
	put64(g0, 16, 4294967296);  /* 4 GiB read on GPU 0 */
	put64(g0, 48, 1024);
	put64(g0, 72, 1024);        /* all through POSIX (compat mode) */
	put64(g0, 112, 2);
	/* GPU 1: no UUID; 10 reads of 4 KiB by nvidia-fs, 0 through POSIX */
	put64(g1, 16, 40960);
	put64(g1, 48, 10);
	put64(g1, 56, 4);
	put64(g1, 64, 6);
	return ok;
}
#endif
