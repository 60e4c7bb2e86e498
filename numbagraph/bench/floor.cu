// The C++ floor of numbagraph's benchmarks: the tiny kernel `a[i] += n[0]`
// driven through the CUDA runtime with nothing in between.
//
// Built at run time by numbagraph.bench with nvcc. One run measures one mode
// and prints its timings as one JSON object on stdout:
//
//   floor replay  --sizes 1,10,100,1000   graph replay, CUDA events, us per node
//   floor eager                           kernel launch, wall clock, us per launch
//   floor loop                            scalar update + 1-node graph launch, wall
//   floor capture --sizes 10,100,1000     capture + instantiate, wall, us per capture
//   floor phases --sizes 10,100,1000      capture alone, instantiate alone and update
//                                         alone (cudaGraphExecUpdate from a graph of
//                                         the same launches on another array), wall,
//                                         us per capture
//   floor setparams                       one node's parameters set on an executable
//                                         graph (kernel, copy and fill node), each
//                                         call moving it to the other of two buffers,
//                                         wall, us per call
//   floor moved --nodes 100 --sizes 1,10,100
//                                         a step of `nodes` kernel launches, copies or
//                                         fills, `size` of them on a buffer that
//                                         alternates between two: each call sets
//                                         those nodes' parameters and launches the
//                                         graph, against the launch alone; each call
//                                         timed alone, the stream synchronised
//                                         (untimed) before it, us per call; with
//                                         --alone 0, calls back to back, wall, us
//                                         per call; --kind kernel|memcpy|memset for one
//                                         kind of node (all three by default)
//
// Common options: --elements N --trials T --warmup W --repeats R, and for
// replay --target U --min-repeats A --max-repeats B (repeats per trial are
// clamp(U / nodes, A, B), the formula the Python side uses), for phases
// --target U (max(1, U / nodes) captures per trial, as the Python side
// makes them), and --blocking 1
// for a stream that synchronises with the legacy default stream, as
// numba's cuda.stream() does (the default is a non-blocking stream).
// On any CUDA error it prints {"error": "..."} and exits with status 1.

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

extern "C" __global__ void tiny(float* a, const float* n, int size) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < size) a[i] += n[0];
}

static void fail(const char* what, cudaError_t err) {
    std::printf("{\"error\": \"%s: %s\"}\n", what, cudaGetErrorString(err));
    std::exit(1);
}

#define CK(call)                                  \
    do {                                          \
        cudaError_t err_ = (call);                \
        if (err_ != cudaSuccess) fail(#call, err_); \
    } while (0)

struct Options {
    std::string mode;
    std::vector<long> sizes;
    long elements = 1024;
    long trials = 7;
    long warmup = 100;
    long repeats = 1000;
    long target = 200000;
    long min_repeats = 20;
    long max_repeats = 5000;
    long blocking = 0;  // 1: a stream that synchronises with the legacy default stream
    long nodes = 100;
    long alone = 1;  // 0: moved mode's calls back to back, not each alone
    std::string kind = "all";  // moved mode: kernel, memcpy, memset or all
};

static std::vector<long> parse_list(const char* text) {
    std::vector<long> out;
    for (const char* p = text; *p;) {
        char* end = nullptr;
        out.push_back(std::strtol(p, &end, 10));
        p = (*end == ',') ? end + 1 : end;
        if (end == p && *p) break;
    }
    return out;
}

static Options parse(int argc, char** argv) {
    Options o;
    if (argc < 2) {
        std::printf("{\"error\": \"usage: floor replay|eager|loop|capture|phases|setparams|moved "
                    "[options]\"}\n");
        std::exit(2);
    }
    o.mode = argv[1];
    for (int i = 2; i + 1 < argc; i += 2) {
        std::string key = argv[i];
        const char* val = argv[i + 1];
        if (key == "--sizes") o.sizes = parse_list(val);
        else if (key == "--elements") o.elements = std::atol(val);
        else if (key == "--trials") o.trials = std::atol(val);
        else if (key == "--warmup") o.warmup = std::atol(val);
        else if (key == "--repeats") o.repeats = std::atol(val);
        else if (key == "--target") o.target = std::atol(val);
        else if (key == "--min-repeats") o.min_repeats = std::atol(val);
        else if (key == "--max-repeats") o.max_repeats = std::atol(val);
        else if (key == "--blocking") o.blocking = std::atol(val);
        else if (key == "--nodes") o.nodes = std::atol(val);
        else if (key == "--alone") o.alone = std::atol(val);
        else if (key == "--kind") o.kind = val;
        else {
            std::printf("{\"error\": \"unknown option %s\"}\n", key.c_str());
            std::exit(2);
        }
    }
    return o;
}

using Clock = std::chrono::steady_clock;

static double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Tiny {
    float* a = nullptr;
    float* n = nullptr;
    int size = 0;
    dim3 grid, block;

    explicit Tiny(long elements) : size(static_cast<int>(elements)) {
        CK(cudaMalloc(&a, size * sizeof(float)));
        CK(cudaMalloc(&n, sizeof(float)));
        CK(cudaMemset(a, 0, size * sizeof(float)));
        float one = 1.0f;
        CK(cudaMemcpy(n, &one, sizeof(float), cudaMemcpyHostToDevice));
        block = dim3(256);
        grid = dim3((size + 255) / 256);
    }
    void launch(cudaStream_t s) const { launch_on(a, s); }
    void launch_on(float* target, cudaStream_t s) const {
        tiny<<<grid, block, 0, s>>>(target, n, size);
    }
    ~Tiny() {
        cudaFree(a);
        cudaFree(n);
    }
};

// The graph of `nodes` launches of the kernel on `target`, not instantiated.
static cudaGraph_t record(const Tiny& k, float* target, cudaStream_t s, long nodes) {
    cudaGraph_t graph;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (long i = 0; i < nodes; ++i) k.launch_on(target, s);
    CK(cudaStreamEndCapture(s, &graph));
    return graph;
}

static cudaGraphExec_t capture(const Tiny& k, cudaStream_t s, long nodes) {
    cudaGraph_t graph = record(k, k.a, s, nodes);
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphDestroy(graph));
    return exec;
}

// One result line: a case, its parameter and the per-unit time of each trial.
struct Result {
    std::string label;
    double param;
    std::string unit;
    std::vector<double> trials;
};

static void print(const std::string& mode, const std::vector<Result>& results) {
    std::printf("{\"mode\": \"%s\", \"results\": [", mode.c_str());
    for (size_t r = 0; r < results.size(); ++r) {
        const Result& res = results[r];
        std::printf("%s{\"label\": \"%s\", \"param\": %g, \"unit\": \"%s\", \"trials\": [",
                    r ? ", " : "", res.label.c_str(), res.param, res.unit.c_str());
        for (size_t i = 0; i < res.trials.size(); ++i)
            std::printf("%s%.6g", i ? ", " : "", res.trials[i]);
        std::printf("]}");
    }
    std::printf("]}\n");
}

static void run_replay(const Options& o, cudaStream_t s, const Tiny& k) {
    std::vector<Result> results;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (long nodes : o.sizes) {
        long reps = std::clamp(o.target / nodes, o.min_repeats, o.max_repeats);
        cudaGraphExec_t exec = capture(k, s, nodes);
        CK(cudaGraphUpload(exec, s));
        for (long i = 0; i < reps; ++i) CK(cudaGraphLaunch(exec, s));  // one untimed trial
        CK(cudaStreamSynchronize(s));
        Result res{"replay", static_cast<double>(nodes), "us/node", {}};
        for (long t = 0; t < o.trials; ++t) {
            CK(cudaEventRecord(e0, s));
            for (long i = 0; i < reps; ++i) CK(cudaGraphLaunch(exec, s));
            CK(cudaEventRecord(e1, s));
            CK(cudaEventSynchronize(e1));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            res.trials.push_back(ms * 1e3 / (static_cast<double>(reps) * nodes));
        }
        results.push_back(res);
        CK(cudaGraphExecDestroy(exec));
    }
    print(o.mode, results);
}

template <typename Step>
static Result wall(const Options& o, cudaStream_t s, const char* label, Step step) {
    for (long i = 0; i < o.warmup; ++i) step(i);
    CK(cudaStreamSynchronize(s));
    Result res{label, 0, "us", {}};
    for (long t = 0; t < o.trials; ++t) {
        auto t0 = Clock::now();
        for (long i = 0; i < o.repeats; ++i) step(i);
        CK(cudaStreamSynchronize(s));
        res.trials.push_back(seconds_since(t0) * 1e6 / o.repeats);
    }
    return res;
}

static void run_eager(const Options& o, cudaStream_t s, const Tiny& k) {
    std::vector<Result> results;
    results.push_back(wall(o, s, "launch", [&](long) { k.launch(s); }));
    CK(cudaGetLastError());
    print(o.mode, results);
}

static void run_loop(const Options& o, cudaStream_t s, const Tiny& k) {
    // Each step writes its value into a fresh pinned slot, so no copy still
    // in flight can see a later value.
    float* ring = nullptr;
    long slots = std::max(o.repeats, o.warmup);
    CK(cudaMallocHost(&ring, slots * sizeof(float)));
    cudaGraphExec_t exec = capture(k, s, 1);
    CK(cudaGraphUpload(exec, s));
    std::vector<Result> results;
    results.push_back(wall(o, s, "update + launch", [&](long i) {
        ring[i] = static_cast<float>(i % 1000);
        CK(cudaMemcpyAsync(k.n, ring + i, sizeof(float), cudaMemcpyHostToDevice, s));
        CK(cudaGraphLaunch(exec, s));
    }));
    results.push_back(wall(o, s, "update only", [&](long i) {
        ring[i] = static_cast<float>(i % 1000);
        CK(cudaMemcpyAsync(k.n, ring + i, sizeof(float), cudaMemcpyHostToDevice, s));
    }));
    results.push_back(wall(o, s, "launch only", [&](long) { CK(cudaGraphLaunch(exec, s)); }));
    CK(cudaGraphExecDestroy(exec));
    CK(cudaFreeHost(ring));
    print(o.mode, results);
}

static void run_capture(const Options& o, cudaStream_t s, const Tiny& k) {
    std::vector<Result> results;
    for (long nodes : o.sizes) {
        for (long i = 0; i < o.warmup; ++i) CK(cudaGraphExecDestroy(capture(k, s, nodes)));
        Result res{"capture", static_cast<double>(nodes), "us", {}};
        for (long t = 0; t < o.trials; ++t) {
            auto t0 = Clock::now();
            cudaGraphExec_t exec = capture(k, s, nodes);
            res.trials.push_back(seconds_since(t0) * 1e6);
            CK(cudaGraphExecDestroy(exec));
        }
        results.push_back(res);
    }
    print(o.mode, results);
}

static void run_phases(const Options& o, cudaStream_t s, const Tiny& k) {
    // Each trial makes max(1, target / nodes) graphs and times, each phase
    // over all of them: their capture, their instantiation, and the update
    // of each executable from a graph of the same launches on another array
    // (captured untimed). Everything is destroyed untimed before the next.
    float* other = nullptr;
    CK(cudaMalloc(&other, k.size * sizeof(float)));
    std::vector<Result> results;
    for (long nodes : o.sizes) {
        long reps = std::max(1L, o.target / nodes);
        std::vector<cudaGraph_t> graphs(reps), sources(reps);
        std::vector<cudaGraphExec_t> execs(reps);
        Result phase[3] = {{"capture alone", static_cast<double>(nodes), "us", {}},
                           {"instantiate alone", static_cast<double>(nodes), "us", {}},
                           {"update alone", static_cast<double>(nodes), "us", {}}};
        for (long t = -1; t < o.trials; ++t) {  // trial -1: untimed
            auto t0 = Clock::now();
            for (long r = 0; r < reps; ++r) graphs[r] = record(k, k.a, s, nodes);
            double capture_us = seconds_since(t0) * 1e6 / reps;
            t0 = Clock::now();
            for (long r = 0; r < reps; ++r) CK(cudaGraphInstantiate(&execs[r], graphs[r], 0));
            double instantiate_us = seconds_since(t0) * 1e6 / reps;
            for (long r = 0; r < reps; ++r) sources[r] = record(k, other, s, nodes);
            t0 = Clock::now();
            for (long r = 0; r < reps; ++r) {
                cudaGraphExecUpdateResultInfo info;
                CK(cudaGraphExecUpdate(execs[r], sources[r], &info));
            }
            double update_us = seconds_since(t0) * 1e6 / reps;
            for (long r = 0; r < reps; ++r) {
                CK(cudaGraphExecDestroy(execs[r]));
                CK(cudaGraphDestroy(graphs[r]));
                CK(cudaGraphDestroy(sources[r]));
            }
            if (t < 0) continue;
            phase[0].trials.push_back(capture_us);
            phase[1].trials.push_back(instantiate_us);
            phase[2].trials.push_back(update_us);
        }
        results.insert(results.end(), phase, phase + 3);
    }
    CK(cudaFree(other));
    print(o.mode, results);
}

// The node of `type` in `graph`, which holds one of each type it has.
static cudaGraphNode_t node_of(cudaGraph_t graph, cudaGraphNodeType type) {
    size_t count = 0;
    CK(cudaGraphGetNodes(graph, nullptr, &count));
    std::vector<cudaGraphNode_t> nodes(count);
    CK(cudaGraphGetNodes(graph, nodes.data(), &count));
    for (cudaGraphNode_t node : nodes) {
        cudaGraphNodeType found;
        CK(cudaGraphNodeGetType(node, &found));
        if (found == type) return node;
    }
    std::printf("{\"error\": \"the captured graph has no node of type %d\"}\n",
                static_cast<int>(type));
    std::exit(1);
}

// Device buffers of `bytes` each, zeroed; freed with it.
struct Buffers {
    std::vector<float*> at;
    Buffers(int count, size_t bytes) : at(count, nullptr) {
        for (float*& b : at) {
            CK(cudaMalloc(&b, bytes));
            CK(cudaMemset(b, 0, bytes));
        }
    }
    ~Buffers() {
        for (float* b : at) cudaFree(b);
    }
};

// A node's parameters launching the tiny kernel as `k` does, with the
// arguments `args` points at.
static cudaKernelNodeParams tiny_node(const Tiny& k, void** args) {
    cudaKernelNodeParams launch = {};
    launch.func = reinterpret_cast<void*>(tiny);
    launch.gridDim = k.grid;
    launch.blockDim = k.block;
    launch.sharedMemBytes = 0;
    launch.kernelParams = args;
    launch.extra = nullptr;
    return launch;
}

static void run_setparams(const Options& o, cudaStream_t s, const Tiny& k) {
    // One graph of a kernel launch on `a`, a copy from `a` into `copied` and
    // a fill of `filled`; each call sets one node's parameters, its buffer
    // alternating with `spare`. Nothing is launched while they are timed.
    size_t bytes = k.size * sizeof(float);
    Buffers buffers(3, bytes);
    float *spare = buffers.at[0], *copied = buffers.at[1], *filled = buffers.at[2];
    cudaGraph_t graph;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    k.launch(s);
    CK(cudaMemcpyAsync(copied, k.a, bytes, cudaMemcpyDeviceToDevice, s));
    CK(cudaMemsetAsync(filled, 0, bytes, s));
    CK(cudaStreamEndCapture(s, &graph));
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, graph, 0));
    cudaGraphNode_t kernel = node_of(graph, cudaGraphNodeTypeKernel);
    cudaGraphNode_t copy = node_of(graph, cudaGraphNodeTypeMemcpy);
    cudaGraphNode_t fill = node_of(graph, cudaGraphNodeTypeMemset);

    float* arg_a = k.a;
    const float* arg_n = k.n;
    int arg_size = k.size;
    void* args[] = {&arg_a, &arg_n, &arg_size};
    cudaKernelNodeParams launch = tiny_node(k, args);
    cudaMemsetParams memset_params = {};
    CK(cudaGraphMemsetNodeGetParams(fill, &memset_params));
    float* sources[] = {k.a, spare};
    float* fills[] = {filled, spare};

    std::vector<Result> results;
    results.push_back(wall(o, s, "kernel node", [&](long i) {
        arg_a = sources[i & 1];
        CK(cudaGraphExecKernelNodeSetParams(exec, kernel, &launch));
    }));
    results.push_back(wall(o, s, "memcpy node", [&](long i) {
        CK(cudaGraphExecMemcpyNodeSetParams1D(exec, copy, copied, sources[i & 1], bytes,
                                              cudaMemcpyDeviceToDevice));
    }));
    results.push_back(wall(o, s, "memset node", [&](long i) {
        memset_params.dst = fills[i & 1];
        CK(cudaGraphExecMemsetNodeSetParams(exec, fill, &memset_params));
    }));
    // The executable must still run, with the parameters set last.
    CK(cudaGraphLaunch(exec, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    print(o.mode, results);
}

// Host time of each call made alone: the stream synchronised, untimed,
// before it, so that no earlier launch still running hides or adds to it.
template <typename Call>
static Result alone(const Options& o, cudaStream_t s, const std::string& label, double param,
                    Call call) {
    for (long i = 0; i < o.warmup; ++i) {
        CK(cudaStreamSynchronize(s));
        call(i);
    }
    Result res{label, param, "us", {}};
    for (long t = 0; t < o.trials; ++t) {
        double total = 0;
        for (long i = 0; i < o.repeats; ++i) {
            CK(cudaStreamSynchronize(s));
            auto t0 = Clock::now();
            call(i);
            total += seconds_since(t0);
        }
        res.trials.push_back(total * 1e6 / o.repeats);
    }
    CK(cudaStreamSynchronize(s));
    return res;
}

// The nodes of `graph` whose first pointer (a launch's first argument, a
// copy's source, a fill's destination) is `ptr`.
static std::vector<cudaGraphNode_t> nodes_on(cudaGraph_t graph, const void* ptr) {
    size_t count = 0;
    CK(cudaGraphGetNodes(graph, nullptr, &count));
    std::vector<cudaGraphNode_t> nodes(count), found;
    CK(cudaGraphGetNodes(graph, nodes.data(), &count));
    for (cudaGraphNode_t node : nodes) {
        cudaGraphNodeType type;
        CK(cudaGraphNodeGetType(node, &type));
        const void* first = nullptr;
        if (type == cudaGraphNodeTypeKernel) {
            cudaKernelNodeParams p = {};
            CK(cudaGraphKernelNodeGetParams(node, &p));
            first = *static_cast<void**>(p.kernelParams[0]);
        } else if (type == cudaGraphNodeTypeMemcpy) {
            cudaMemcpy3DParms p = {};
            CK(cudaGraphMemcpyNodeGetParams(node, &p));
            first = p.srcPtr.ptr;
        } else if (type == cudaGraphNodeTypeMemset) {
            cudaMemsetParams p = {};
            CK(cudaGraphMemsetNodeGetParams(node, &p));
            first = p.dst;
        }
        if (first == ptr) found.push_back(node);
    }
    return found;
}

static void run_moved(const Options& o, cudaStream_t s, const Tiny& k) {
    // A step of `nodes` nodes of one kind, the last `moved` of them on `x`
    // and the others on `a`: kernel launches of the tiny kernel, copies of
    // the buffer into `copied`, or fills of its first word. Each call puts
    // the moved nodes on the other of `x` and `spare` and launches; the
    // plain call launches alone. The same shapes as numbagraph's steps.
    size_t bytes = k.size * sizeof(float);
    Buffers buffers(3, bytes);
    float *x = buffers.at[0], *spare = buffers.at[1], *copied = buffers.at[2];
    float* sources[] = {x, spare};
    const char* kinds[] = {"kernel", "memcpy", "memset"};
    std::vector<Result> results;
    for (int which = 0; which < 3; ++which) {
        const char* kind = kinds[which];
        std::string name = kind;
        if (o.kind != "all" && o.kind != name) continue;
        for (long moved : o.sizes) {
            if (moved < 1 || moved > o.nodes) {
                std::printf("{\"error\": \"moved %ld of %ld nodes\"}\n", moved, o.nodes);
                std::exit(2);
            }
            cudaGraph_t graph;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            for (long i = 0; i < o.nodes; ++i) {
                float* on = i < o.nodes - moved ? k.a : x;
                if (which == 0) k.launch_on(on, s);
                else if (which == 1)
                    CK(cudaMemcpyAsync(copied, on, bytes, cudaMemcpyDeviceToDevice, s));
                else CK(cudaMemsetAsync(on, 0, sizeof(float), s));
            }
            CK(cudaStreamEndCapture(s, &graph));
            std::vector<cudaGraphNode_t> targets = nodes_on(graph, x);
            if (static_cast<long>(targets.size()) != moved) {
                std::printf("{\"error\": \"%s step: %zu nodes on the moved buffer, "
                            "expected %ld\"}\n", kind, targets.size(), moved);
                std::exit(1);
            }
            cudaGraphExec_t exec;
            CK(cudaGraphInstantiate(&exec, graph, 0));
            CK(cudaGraphUpload(exec, s));
            float* arg_a = x;
            const float* arg_n = k.n;
            int arg_size = k.size;
            void* args[] = {&arg_a, &arg_n, &arg_size};
            cudaKernelNodeParams launch = tiny_node(k, args);
            cudaMemsetParams fill = {};
            if (which == 2) CK(cudaGraphMemsetNodeGetParams(targets[0], &fill));
            double param = static_cast<double>(moved);
            auto timed = [&](const std::string& label, auto call) {
                if (o.alone) return alone(o, s, label, param, call);
                Result res = wall(o, s, label.c_str(), call);
                res.param = param;
                return res;
            };
            results.push_back(timed(name + " moved", [&](long i) {
                float* to = sources[(i + 1) & 1];
                for (cudaGraphNode_t node : targets) {
                    if (which == 0) {
                        arg_a = to;
                        CK(cudaGraphExecKernelNodeSetParams(exec, node, &launch));
                    } else if (which == 1) {
                        CK(cudaGraphExecMemcpyNodeSetParams1D(exec, node, copied, to, bytes,
                                                              cudaMemcpyDeviceToDevice));
                    } else {
                        fill.dst = to;
                        CK(cudaGraphExecMemsetNodeSetParams(exec, node, &fill));
                    }
                }
                CK(cudaGraphLaunch(exec, s));
            }));
            results.push_back(timed(name + " launch", [&](long) { CK(cudaGraphLaunch(exec, s)); }));
            CK(cudaGraphExecDestroy(exec));
            CK(cudaGraphDestroy(graph));
        }
    }
    print(o.mode, results);
}

int main(int argc, char** argv) {
    Options o = parse(argc, argv);
    int devices = 0;
    CK(cudaGetDeviceCount(&devices));
    CK(cudaFree(nullptr));  // create the context outside every timing
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, o.blocking ? cudaStreamDefault : cudaStreamNonBlocking));
    {
        Tiny k(o.elements);
        k.launch(s);
        CK(cudaStreamSynchronize(s));
        if (o.mode == "replay") run_replay(o, s, k);
        else if (o.mode == "eager") run_eager(o, s, k);
        else if (o.mode == "loop") run_loop(o, s, k);
        else if (o.mode == "capture") run_capture(o, s, k);
        else if (o.mode == "phases") run_phases(o, s, k);
        else if (o.mode == "setparams") run_setparams(o, s, k);
        else if (o.mode == "moved") run_moved(o, s, k);
        else {
            std::printf("{\"error\": \"unknown mode %s\"}\n", o.mode.c_str());
            return 2;
        }
    }
    CK(cudaStreamDestroy(s));
    return 0;
}
