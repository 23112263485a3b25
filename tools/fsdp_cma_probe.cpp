// fsdp-cma-probe: exits 0 when this process may read another process's
// memory with process_vm_readv (Linux Cross Memory Attach), 1 otherwise,
// saying why on stderr.
//
// fsdp-run asks it before choosing OpenMPI's shared-memory single-copy
// mechanism. With CMA, a large message is one kernel copy; without it, OpenMPI
// pipes it through 32 KiB fragments of a shared FIFO, and every fragment needs
// the receiving rank's communication thread to run. On a machine whose cores
// are all busy computing that costs 20-40x (measured on 2 cores, 2 ranks each
// with a busy compute thread: a 12.6 MB reduce-scatter in 1055 ms without CMA,
// 26 ms with). Containers often forbid the syscall (seccomp, Yama's
// ptrace_scope); OpenMPI would then abort at the first large message, so it is
// tried here first, between a parent and a child, as OpenMPI's ranks would use it.
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

int main() {
  std::vector<unsigned char> source(1 << 16);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<unsigned char>(i * 7 + 3);
  int ready[2], done[2];
  if (pipe(ready) != 0 || pipe(done) != 0) {
    std::perror("fsdp-cma-probe: pipe");
    return 1;
  }
  const pid_t child = fork();
  if (child < 0) {
    std::perror("fsdp-cma-probe: fork");
    return 1;
  }
  if (child == 0) {  // the child holds its copy of `source` until the parent has read it
    char byte = 1;
    if (write(ready[1], &byte, 1) != 1) _exit(1);
    if (read(done[0], &byte, 1) < 0) _exit(1);
    _exit(0);
  }
  char byte = 0;
  const bool child_ready = read(ready[0], &byte, 1) == 1;
  std::vector<unsigned char> copy(source.size(), 0);
  iovec local{copy.data(), copy.size()}, remote{source.data(), source.size()};
  const ssize_t got = child_ready ? process_vm_readv(child, &local, 1, &remote, 1, 0) : -1;
  const int error = errno;
  if (write(done[1], &byte, 1) != 1) std::perror("fsdp-cma-probe: write");
  waitpid(child, nullptr, 0);
  if (got == static_cast<ssize_t>(copy.size()) && copy == source) return 0;
  std::fprintf(stderr, "fsdp-cma-probe: process_vm_readv of %zu bytes from a child process %s\n", source.size(),
               got < 0 ? std::strerror(error) : "returned other bytes");
  return 1;
}
