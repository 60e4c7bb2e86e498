"""A transformer-style decode loop, captured once and replayed per token.

One decode step of a small pre-norm transformer, built from numbagraph ops
and two kernels of our own:

  embedding lookup at the token and at the position  (take_into, add_into)
  per layer:
    rmsnorm -> q, k, v in one projection             (rmsnorm_into, matvec_into)
    append k, v to the layer's caches at row pos     (put_into)
    scores of q against cache rows 0..pos, masked    (attention_scores, our kernel)
    softmax, weighted sum of the cached values       (softmax_into, attention_values, ours)
    output projection, residual add                  (matvec_into, add_into)
    rmsnorm -> MLP with GELU -> residual add         (matvec_into, gelu_into, add_into)
  final rmsnorm, logits, greedy pick                  (rmsnorm_into, matvec_into, argmax_into)
  the step's logits and pick stored at row pos        (put_into)

Every one of these is a kernel launch: no cuBLAS product, copy or scalar
update, so that the one-launch loop below may run several steps per
iteration of its while node.

The token and the position live in DeviceScalars, so the step is captured
into a graph once and replayed for every token after ``pos.update(t)``.
The loop runs eagerly and as a graph; both are checked token by token
against a NumPy reference, and the time per token of each is printed.
Then the whole decode runs in one launch: ``ng.repeat`` loops the step on
the GPU, advancing ``pos``, until a kernel sees the end token picked, with
``unroll="auto"``: as many steps per iteration of its while node as pay
for the iteration's own cost (one for a step of many kernels), the steps
after the end token skipped on the device.

It runs two sizes: four layers, whose token's work on the GPU outweighs
what launching it costs, and one layer of about two dozen small kernels a
token, where the launch's own cost shows (its lines start with "small").

Run: python examples/decode_loop.py   (no GPU: runs on Numba's simulator)
"""

import numbagraph as ng  # first, so it can choose the simulator without a GPU

import math
import time
from dataclasses import dataclass

import numpy as np
from numba import cuda, float32

ON_GPU = ng.backend() == "cuda"


@dataclass(frozen=True)
class Config:
    vocab: int
    dim: int
    heads: int
    hidden: int
    layers: int
    tokens: int

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


# The simulator runs one Python thread per GPU thread: keep it tiny there.
CONFIG = (Config(vocab=2048, dim=256, heads=4, hidden=1024, layers=4, tokens=64) if ON_GPU
          else Config(vocab=16, dim=8, heads=2, hidden=16, layers=1, tokens=3))
# The second size: one layer, about two dozen small kernels per token.
SMALL = (Config(vocab=1024, dim=128, heads=4, hidden=512, layers=1, tokens=64) if ON_GPU
         else Config(vocab=8, dim=4, heads=1, hidden=8, layers=1, tokens=2))
EPS = 1e-6
VALUE_THREADS = 128


@cuda.jit
def attention_scores(q, keys, pos, scale, scores):
    """scores[h, j] = (q_h . k_h of cache row j) * scale for rows j <= pos[0],
    and -inf for the rows not written yet, so softmax gives them no weight.
    Row j of ``keys`` holds every head's key, head h at h * head_dim."""
    j, h = cuda.grid(2)
    heads, length = scores.shape
    head_dim = q.size // heads
    if h < heads and j < length:
        if j <= pos[0]:
            base = h * head_dim
            acc = float32(0.0)
            for d in range(head_dim):
                acc += q[base + d] * keys[j, base + d]
            scores[h, j] = acc * scale
        else:
            scores[h, j] = -math.inf


@cuda.jit
def attention_values(probs, values, pos, out):
    """out[i] = sum over cache rows j <= pos[0] of probs[h, j] * values[j, i],
    for element i of head h (the weights of rows past pos are 0)."""
    i = cuda.grid(1)
    heads, length = probs.shape
    if i < out.size:
        h = i // (out.size // heads)
        rows = min(pos[0] + 1, length)
        acc = float32(0.0)
        for j in range(rows):
            acc += probs[h, j] * values[j, i]
        out[i] = acc


@cuda.jit
def stop_at_token(best, end_token, cond):
    """End the decode loop once the step picked the end token."""
    if cuda.grid(1) == 0 and best[0] == end_token:
        ng.set_condition(cond, 0)


class Model:
    """Random weights on the device, the caches and every intermediate array:
    all allocated before capture."""

    def __init__(self, cfg: Config, s, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.cfg = cfg

        def weight(*shape, scale=None):
            scale = 1.0 / math.sqrt(shape[-1]) if scale is None else scale
            return (rng.standard_normal(shape) * scale).astype(np.float32)

        d, f, h, t = cfg.dim, cfg.hidden, cfg.heads, cfg.tokens
        self.host = {
            "embed": weight(cfg.vocab, d, scale=1.0),
            "position": weight(t, d, scale=0.1),
            "norm1": 1 + weight(cfg.layers, d, scale=0.1),
            "norm2": 1 + weight(cfg.layers, d, scale=0.1),
            # The q, k and v projections stacked: rows 0..d-1 give q, then k, v.
            "wqkv": weight(cfg.layers, 3 * d, d), "wo": weight(cfg.layers, d, d),
            "w1": weight(cfg.layers, f, d), "w2": weight(cfg.layers, d, f),
            "norm_out": 1 + weight(d, scale=0.1),
            "unembed": weight(cfg.vocab, d),
            "prompt": rng.integers(0, cfg.vocab, t).astype(np.int32),
        }
        dev = {name: cuda.to_device(value, stream=s) for name, value in self.host.items()}
        self.w = dev
        zeros = lambda *shape, dtype=np.float32: ng.zeros(shape, dtype, stream=s)  # noqa: E731
        # Row j of a layer's cache: every head's key (or value) at position j.
        self.k_cache = zeros(cfg.layers, t, d)
        self.v_cache = zeros(cfg.layers, t, d)
        self.x, self.h, self.pe = zeros(d), zeros(d), zeros(d)
        self.qkv = zeros(3 * d)
        self.attn, self.o, self.f = zeros(d), zeros(d), zeros(f)
        self.scores, self.probs = zeros(h, t), zeros(h, t)
        self.logits = zeros(cfg.vocab)
        self.logits_log = zeros(t, cfg.vocab)
        self.picks = zeros(t, dtype=np.int32)
        self.token = ng.DeviceScalar(0, dtype=np.int32, stream=s)
        self.best = ng.DeviceScalar(0, dtype=np.int32, stream=s)
        self.pos = ng.DeviceScalar(0, dtype=np.int32, stream=s)
        self.scale = np.float32(1.0 / math.sqrt(cfg.head_dim))
        # Views made once: slicing a device array costs host time every step.
        self.q, self.k, self.v = self.qkv[:d], self.qkv[d:2 * d], self.qkv[2 * d:]
        self.layer = [{name: dev[name][i] for name in ("norm1", "norm2", "wqkv", "wo",
                                                       "w1", "w2")}
                      for i in range(cfg.layers)]
        for i, views in enumerate(self.layer):
            views["k_cache"], views["v_cache"] = self.k_cache[i], self.v_cache[i]
        self.score_grid = ((t + 31) // 32, h)
        threads = min(VALUE_THREADS, d)
        self.value_grid, self.value_block = (d + threads - 1) // threads, threads

    def reset(self, s) -> None:
        for cache in (self.k_cache, self.v_cache, self.logits_log):
            ng.fill_into(cache, 0.0, stream=s)

    def step(self, s) -> None:
        """One token at position pos[0]: every launch goes on stream s."""
        cfg, w = self.cfg, self.w
        pos, x, h = self.pos, self.x, self.h
        ng.take_into(w["prompt"], pos, self.token, stream=s)
        ng.take_into(w["embed"], self.token, x, stream=s)
        ng.take_into(w["position"], pos, self.pe, stream=s)
        ng.add_into(x, self.pe, x, stream=s)
        for lw in self.layer:
            ng.rmsnorm_into(x, lw["norm1"], h, eps=EPS, stream=s)
            ng.matvec_into(lw["wqkv"], h, self.qkv, stream=s)
            ng.put_into(self.k, pos, lw["k_cache"], stream=s)
            ng.put_into(self.v, pos, lw["v_cache"], stream=s)
            attention_scores[self.score_grid, (32, 1), s](self.q, lw["k_cache"], pos,
                                                          self.scale, self.scores)
            ng.softmax_into(self.scores, self.probs, stream=s)
            attention_values[self.value_grid, self.value_block, s](self.probs, lw["v_cache"],
                                                                   pos, self.attn)
            ng.matvec_into(lw["wo"], self.attn, self.o, stream=s)
            ng.add_into(x, self.o, x, stream=s)
            ng.rmsnorm_into(x, lw["norm2"], h, eps=EPS, stream=s)
            ng.matvec_into(lw["w1"], h, self.f, stream=s)
            ng.gelu_into(self.f, self.f, stream=s)
            ng.matvec_into(lw["w2"], self.f, self.o, stream=s)
            ng.add_into(x, self.o, x, stream=s)
        ng.rmsnorm_into(x, w["norm_out"], h, eps=EPS, stream=s)
        ng.matvec_into(w["unembed"], h, self.logits, stream=s)
        ng.argmax_into(self.logits, self.best, stream=s)
        ng.put_into(self.logits, pos, self.logits_log, stream=s)
        ng.put_into(self.best, pos, self.picks, stream=s)


def reference(model: Model) -> np.ndarray:
    """The logits of every step, computed by NumPy in float64."""
    cfg, w = model.cfg, {k: v.astype(np.float64) for k, v in model.host.items()}
    hd = cfg.head_dim
    erf = np.vectorize(math.erf)

    def rmsnorm(v, g):
        return v / np.sqrt((v * v).mean() + EPS) * g

    keys = np.zeros((cfg.layers, cfg.heads, cfg.tokens, hd))
    values = np.zeros_like(keys)
    logits = np.zeros((cfg.tokens, cfg.vocab))
    for t in range(cfg.tokens):
        x = w["embed"][model.host["prompt"][t]] + w["position"][t]
        for layer in range(cfg.layers):
            h = rmsnorm(x, w["norm1"][layer])
            q, k, v = np.split(w["wqkv"][layer] @ h, 3)
            keys[layer, :, t] = k.reshape(cfg.heads, hd)
            values[layer, :, t] = v.reshape(cfg.heads, hd)
            scores = np.einsum("hd,hjd->hj", q.reshape(cfg.heads, hd),
                               keys[layer, :, :t + 1]) / math.sqrt(hd)
            p = np.exp(scores - scores.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            attn = np.einsum("hj,hjd->hd", p, values[layer, :, :t + 1]).reshape(cfg.dim)
            x = x + w["wo"][layer] @ attn
            f = w["w1"][layer] @ rmsnorm(x, w["norm2"][layer])
            f = 0.5 * f * (1 + erf(f / math.sqrt(2)))
            x = x + w["w2"][layer] @ f
        logits[t] = w["unembed"] @ rmsnorm(x, w["norm_out"])
    return logits


def check(model: Model, s, expected: np.ndarray, label: str, tokens: int | None = None) -> None:
    got = model.logits_log.copy_to_host(stream=s)
    picks = model.picks.copy_to_host(stream=s)
    s.synchronize()
    scale = np.abs(expected).max()
    tokens = model.cfg.tokens if tokens is None else tokens
    if tokens < model.cfg.tokens:
        assert not got[tokens:].any(), f"{label}: logits written past token {tokens - 1}"
    for t in range(tokens):
        np.testing.assert_allclose(got[t], expected[t], rtol=1e-3, atol=1e-3 * scale,
                                   err_msg=f"{label}: logits of token {t}")
        top2 = np.sort(expected[t])[-2:]
        if top2[1] - top2[0] > 1e-3 * scale:  # a clear winner must be picked
            assert picks[t] == expected[t].argmax(), f"{label}: pick of token {t}"


def run_eager(model: Model, s) -> float:
    model.reset(s)
    s.synchronize()
    start = time.perf_counter()
    for t in range(model.cfg.tokens):
        model.pos.update(t)
        model.step(s)
    s.synchronize()
    return time.perf_counter() - start


def run_graph(model: Model, s) -> tuple[float, ng.CapturedGraph]:
    with ng.capture(s) as cap:
        model.step(s)
    graph = cap.graph
    graph.upload()
    model.reset(s)
    s.synchronize()
    start = time.perf_counter()
    for t in range(model.cfg.tokens):
        model.pos.update(t)
        graph.launch()
    s.synchronize()
    return time.perf_counter() - start, graph


def run_graph_to_end_token(model: Model, s, graph: ng.CapturedGraph,
                           token: int) -> tuple[float, int]:
    """The decode to the end token as a host loop would run it: the graph per
    token, and the picked token read back after each to decide whether to
    go on. Returns the time and the tokens generated."""
    model.reset(s)
    s.synchronize()
    start = time.perf_counter()
    generated = 0
    for t in range(model.cfg.tokens):
        model.pos.update(t)
        graph.launch()
        generated += 1
        if model.best.value == token:  # waits for the token
            break
    return time.perf_counter() - start, generated


def end_token(expected: np.ndarray) -> tuple[int, int]:
    """``(token, t)``: a token the reference picks clearly at position ``t``
    in the second half of the decode and at no position before, so that a
    decode stopping at that token stops after ``t``."""
    picks = expected.argmax(axis=1)
    margin = 1e-3 * np.abs(expected).max()
    for t in range(len(picks) // 2, len(picks)):
        token = picks[t]
        top2 = np.sort(expected[t])[-2:]
        # A clear pick at t, and clearly not the pick anywhere before it.
        behind = expected[:t].max(axis=1) - expected[:t, token]
        if top2[1] - top2[0] > margin and (behind > margin).all():
            return int(token), t
    return -1, len(picks) - 1          # no such token: the length ends the decode


def run_to_end_token(model: Model, s, token: int) -> tuple[float, int, int]:
    """The whole decode in one launch: the step in a loop on the GPU that
    advances pos until the end token is picked or the length is reached.
    Returns the time, the tokens generated and the steps each iteration of
    the loop's while node runs."""
    ng.precompile(stop_at_token, model.best, token, ng.Condition)
    with ng.capture(s) as cap:
        @ng.repeat(model.pos, until=model.cfg.tokens, unroll="auto")
        def loop(loop):
            model.step(s)
            stop_at_token[1, 1, s](model.best, token, loop.cond)
    graph = cap.graph
    graph.upload()
    model.reset(s)
    model.pos.update(0)
    s.synchronize()
    start = time.perf_counter()
    graph.launch()
    s.synchronize()
    return time.perf_counter() - start, model.pos.value, loop.unroll


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def run_size(cfg: Config, s, name: str = "") -> None:
    """Decode with ``cfg`` eagerly, as a graph per token and in one launch,
    check each against NumPy and print the times; ``name`` starts every
    label of a size after the first (in microseconds, not milliseconds)."""
    lead, colon = (f"{name} ", ":") if name else ("", "")
    print(f"  {name}{colon}{' ' if name else ''}{_count(cfg.layers, 'layer')}, dim {cfg.dim}, "
          f"{_count(cfg.heads, 'head')}, MLP {cfg.hidden}, vocab {cfg.vocab}, "
          f"{cfg.tokens} tokens")
    model = Model(cfg, s)
    expected = reference(model)

    model.pos.update(0)
    model.step(s)  # compile every kernel and give the reductions their scratch
    eager = run_eager(model, s)
    check(model, s, expected, f"{lead}eager")
    replay, graph = run_graph(model, s)
    check(model, s, expected, f"{lead}graph")

    token, last = end_token(expected)
    checked, checked_tokens = run_graph_to_end_token(model, s, graph, token)
    assert checked_tokens == last + 1, f"the host-checked decode stopped after {checked_tokens}"
    check(model, s, expected, f"{lead}graph, host-checked", checked_tokens)
    whole, generated, unroll = run_to_end_token(model, s, token)
    assert generated == last + 1, f"the one-launch decode stopped after {generated} tokens"
    check(model, s, expected, f"{lead}one launch", generated)

    scale, unit, form = (1e3, "ms", "8.3f") if not name else (1e6, "us", "8.2f")
    per_token = scale / cfg.tokens
    print(f"  {lead}graph: {graph.num_nodes} nodes per token, captured once, replayed "
          f"{cfg.tokens} times")
    print(f"  {lead}eager : {eager * per_token:{form}} {unit} per token")
    print(f"  {lead}graph : {replay * per_token:{form}} {unit} per token")
    print(f"  {lead}speed-up{colon} {eager / replay:.1f}x; logits match the NumPy reference "
          "for every token")
    print(f"  {lead}graph, host-checked: {checked * scale / checked_tokens:{form}} {unit} "
          f"per token (the decode to the end token, the token read back after each)")
    steps = _count(unroll, "step")
    print(f"  {lead}one launch: {whole * scale / generated:{form}} {unit} per token (the whole "
          f"decode, {generated} tokens, to the end token {token}; {steps} per iteration of "
          "the while node)")
    print(f"  {lead}one launch speed-up{colon} "
          f"{replay * generated / (whole * cfg.tokens):.1f}x over the graph per token, "
          f"{checked / whole:.1f}x over the host-checked graph; its logits match the "
          "reference up to the end token")


def main() -> None:
    where = "GPU (CUDA driver)" if ON_GPU else "Numba's CUDA simulator (no GPU found)"
    print(f"numbagraph decode loop on {where}")
    s = cuda.stream()
    run_size(CONFIG, s)
    run_size(SMALL, s, "small")
    if not ON_GPU:
        print("  (simulator timings measure Python, not a GPU)")


if __name__ == "__main__":
    main()
