// CPU builds: no CUDA graphs (graph.cpp is compiled into CUDA builds only).
#include <cstdint>

#include "guarded.h"

extern "C" {
int temper_graphs_available() { return 0; }
static int no_graphs(char** err) {
  *err = temper::copy_message("this temper was built without CUDA: no CUDA graphs");
  return 1;
}
int temper_graph_pool(uint64_t*, uint64_t*, char** err) { return no_graphs(err); }
int temper_graph_begin(int, uint64_t, uint64_t, void**, char** err) { return no_graphs(err); }
int temper_graph_end(void*, char** err) { return no_graphs(err); }
int temper_graph_replay(void*, char** err) { return no_graphs(err); }
void temper_graph_free(void*) {}
int temper_use_own_stream(int, char** err) { return no_graphs(err); }
int temper_sync_current_stream(int, char** err) { return no_graphs(err); }
}
