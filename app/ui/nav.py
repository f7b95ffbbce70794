"""The pages of the playground, in menu order: everything the app knows about a page lives here (its
script, title, icon, address, menu group, the line the home page says about it, whether it works
without the model, and the widget namespace a presenter's push fills)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
PAGES_DIR = ROOT / "pages"


@dataclass(frozen=True)
class PageInfo:
    script: str          # file name in pages/
    title: str
    icon: str
    url_path: str
    blurb: str
    section: str = ""    # the menu group it sits in
    offline: bool = False  # works without the model (a full room, or none loaded): draws recordings or needs none
    namespace: str = ""  # widget keys' prefix, which a presenter's push fills; "" = the url path ("home" for home)

    @property
    def path(self) -> Path:
        return PAGES_DIR / self.script

    @property
    def widget_namespace(self) -> str:
        return self.namespace or self.url_path or "home"


HOME = PageInfo("home.py", "Home", ":material/home:", "", "What the playground shows.", offline=True)
PAGES: tuple[PageInfo, ...] = (
    PageInfo("journey.py", "The journey of a request", ":material/route:", "journey",
             "Tokens, the shapes a token takes through every layer, the answer streaming with its timings, "
             "and each token's candidates and logit lens.", section="Inside the model", offline=True),
    PageInfo("attention.py", "Attention", ":material/grid_on:", "attention",
             "Who attends to whom: per layer and head, all heads at once, sinks and distances, grouped-query "
             "attention, and each new token's row during decoding.", section="Inside the model", offline=True),
    PageInfo("attention_math.py", "Attention, step by step", ":material/calculate:", "attention-math",
             "One head of one layer with its real numbers: Q·Kᵀ, ÷√d, the causal mask, softmax and the weighted sum "
             "of V, beside the shapes, checked against the model's own output.", section="Inside the model"),
    PageInfo("kv_cache.py", "The KV cache", ":material/memory:", "kv-cache",
             "The cache growing token by token, what it costs per user on real GPUs, GQA against full "
             "multi-head attention, and paged against contiguous allocation.", section="Inside the model",
             offline=True, namespace="kv"),
    PageInfo("kv_on_off.py", "The KV cache, with and without", ":material/cached:", "kv-on-off",
             "The same answer generated with the cache and without it: per-token time growing with the context "
             "against staying flat, and the compute the cache saves.", section="Inside the model"),
    PageInfo("speculative.py", "Speculative decoding", ":material/fast_forward:", "speculative",
             "A draft guesses k tokens, the model checks them in one pass: the rounds live, acceptance, and the "
             "measured speedup against plain decoding, with the projection for Llama on an H100.", section="Speed"),
    PageInfo("speed_lab.py", "Speed lab", ":material/speed:", "speed-lab",
             "Prefill and decode timed on this machine as the prompt grows, the decode step on this device's "
             "roofline, and a stored answer streamed at any rate from 1 to 2,000 tokens/s.", section="Speed"),
    PageInfo("flash_attention.py", "FlashAttention and kernel fusion", ":material/bolt:", "flash-attention",
             "Eager attention against one fused kernel: time and bytes moved as the prompt grows, measured here, and "
             "projected for an H100 from the memory traffic.", section="Speed"),
    PageInfo("speed_cost.py", "Speed and cost on GPUs", ":material/payments:", "speed-cost",
             "Any model on any GPU, precision, batch and context: memory, TTFT, decode step, tokens/s, $ per "
             "million tokens, the roofline, the batch sweep, and why an output token costs several times an "
             "input token.", section="Serving"),
    PageInfo("speed_batching.py", "Batching", ":material/stacks:", "batching",
             "A simulated server: static against continuous batching, chunked prefill and prefill/decode "
             "disaggregation, goodput within latency targets; and the model really batched on this machine.",
             section="Serving"),
    PageInfo("room.py", "The room is the batch", ":material/groups:", "room",
             "Who is generating on this server right now: the live batch, prefill and decode in each step, "
             "step time and tokens/s against the batch size, measured from the room's own requests.", section="Serving"),
    PageInfo("speed_precision.py", "Precision", ":material/compress:", "precision",
             "Quantize a copy of the loaded model to INT8 and INT4 here: memory, speed, agreement, perplexity; "
             "and what precision does on a GPU.", section="Speed"),
    PageInfo("quantization.py", "Quantization, closely", ":material/tune:", "quantization",
             "Outlier channels in the real activations, round-to-nearest against NF4, why a grid that lines up with "
             "the source shows 0.00% error, and one weight bit by bit in FP32, BF16 and FP16.", section="Speed"),
    PageInfo("model_folder.py", "A model is a folder", ":material/folder_open:", "model-folder",
             "The files the engine loaded, what the weights hold, the measured load and read times, and the copy of "
             "16 GB onto an H100 projected.", section="Inside the model"),
    PageInfo("engines.py", "Where the real engines do it", ":material/map:", "engines",
             "Each mechanism shown here, the paper it comes from, and where vLLM, SGLang, TensorRT-LLM and llama.cpp "
             "implement it.", section="Serving", offline=True),
    PageInfo("quiz.py", "Quiz", ":material/quiz:", "quiz",
             "Questions on prefill and decode, KV sizing, GQA, attention, fusion, the cache, speculative decoding, "
             "quantization, batching and serving economics, each answer explained.", section="For the class",
             offline=True),
    PageInfo("recordings.py", "Recordings", ":material/play_circle:", "recordings",
             "Saved generations with all their captures: open one to explore every page without the model, or "
             "save your own run.", section="For the class", offline=True),
)


def menu() -> dict[str, list[PageInfo]]:
    """The sidebar's groups in the sidebar's order (a group sits where its first page is in PAGES)."""
    groups: dict[str, list[PageInfo]] = {}
    for info in PAGES:
        groups.setdefault(info.section, []).append(info)
    return groups


@dataclass(frozen=True)
class TourStop:
    url_path: str
    minutes: str
    what: str


# A class's first twenty minutes, in the sidebar's order: what to do on each page, for a presenter on a projector.
TOUR: tuple[TourStop, ...] = (
    TourStop("journey", "3 min", "Ask a question and press Generate: the answer streams under the button. Then scroll "
             "down: the prompt as tokens, the shapes through every layer, and one token's candidates as you move the "
             "temperature."),
    TourStop("attention", "3 min", "The same run's attention: pick a layer and a head, find the bright first column "
             "(the attention sink), then step through decoding and watch each new token look back."),
    TourStop("kv-cache", "3 min", "The cache growing with every token, exactly as the formula says; then, in the "
             "calculator, Llama 3.1 8B on an H100 at 1K and at 128K tokens: how many users fit."),
    TourStop("speculative", "3 min", "Press *Copy a passage*, then Generate: green drafts accepted, red rejected, "
             "and the measured speedup. Try *Open question* to see it fall."),
    TourStop("speed-cost", "2 min", "Llama 3.1 8B on an H100: move the batch from 1 to 64 and watch the cost per "
             "million tokens drop."),
    TourStop("room", "3 min", "Ask everyone to press Generate on the journey page at once, with this page on the "
             "projector: the batch fills, each step gets a little slower, the room's tokens per second grow."),
    TourStop("quiz", "3 min", "Questions for the room, each answer explained with the numbers of the pages."),
)


def page_info(url_path: str) -> PageInfo | None:
    return next((p for p in (HOME, *PAGES) if p.url_path == url_path), None)
