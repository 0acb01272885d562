/* A program linked against libcuda.so.1 by the linker, as programs built with -lcuda are:
 * its calls reach the driver through the dynamic linker alone (no dlopen, no dlsym).
 * Allocates COUNT blocks of MIB MiB with cuMemAlloc_v2 and prints each result. */
#include <stdio.h>
#include <stdlib.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice device);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);

int main(int argc, char **argv) {
  int count = argc > 1 ? atoi(argv[1]) : 5;
  size_t mib = argc > 2 ? (size_t)atoll(argv[2]) : 1024;
  CUdevice device;
  CUcontext ctx;
  if (cuInit(0) || cuDeviceGet(&device, 0) || cuDevicePrimaryCtxRetain(&ctx, device) ||
      cuCtxSetCurrent(ctx)) {
    fprintf(stderr, "no context\n");
    return 1;
  }
  for (int i = 1; i <= count; i++) {
    CUdeviceptr p;
    CUresult r = cuMemAlloc_v2(&p, mib << 20);
    if (r == 0)
      printf("allocation %d of %d: ok\n", i, count);
    else
      printf("allocation %d of %d: error %d\n", i, count, r);
  }
  return 0;
}
