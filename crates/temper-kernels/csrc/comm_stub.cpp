// Built instead of comm.cpp when the gloo headers are missing: the same symbols, reporting that
// c10d is unavailable (temper_comm_available() == 0; Comm::connect checks it first).
#include <cstdlib>

extern "C" {
int temper_comm_available() { return 0; }
int temper_comm_nccl_available() { return 0; }
int temper_comm_new(const char*, int, int, int, int, long, int, int, void**, char**) { return 1; }
void temper_comm_free(void*) {}
int temper_comm_all_reduce(void*, void*, char**) { return 1; }
int temper_comm_broadcast(void*, void*, int, char**) { return 1; }
int temper_comm_broadcast_unless(void*, void*, int, const bool*, char**) { return 1; }
int temper_comm_all_gather(void*, void*, void**, char**) { return 1; }
int temper_comm_all_gather_into(void*, void*, void*, char**) { return 1; }
int temper_comm_reduce_scatter(void*, void*, void*, char**) { return 1; }
int temper_comm_barrier(void*, char**) { return 1; }
}
