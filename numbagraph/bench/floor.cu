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
//
// Common options: --elements N --trials T --warmup W --repeats R, and for
// replay --target U --min-repeats A --max-repeats B (repeats per trial are
// clamp(U / nodes, A, B), the formula the Python side uses), and --blocking 1
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
        std::printf("{\"error\": \"usage: floor replay|eager|loop|capture [options]\"}\n");
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
    void launch(cudaStream_t s) const { tiny<<<grid, block, 0, s>>>(a, n, size); }
    ~Tiny() {
        cudaFree(a);
        cudaFree(n);
    }
};

static cudaGraphExec_t capture(const Tiny& k, cudaStream_t s, long nodes) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (long i = 0; i < nodes; ++i) k.launch(s);
    CK(cudaStreamEndCapture(s, &graph));
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
        else {
            std::printf("{\"error\": \"unknown mode %s\"}\n", o.mode.c_str());
            return 2;
        }
    }
    CK(cudaStreamDestroy(s));
    return 0;
}
