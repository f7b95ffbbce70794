"""Where the real engines do it: each mechanism the playground shows, the idea's origin, and where vLLM, SGLang,
TensorRT-LLM and llama.cpp implement it. Plain data (paths checked against the projects' repositories in
2026; files move between releases, so the folder is the safer pointer), drawn as one table per mechanism."""
from __future__ import annotations

from dataclasses import dataclass

ENGINES = ("vLLM", "SGLang", "TensorRT-LLM", "llama.cpp")
REPOS = {"vLLM": "https://github.com/vllm-project/vllm", "SGLang": "https://github.com/sgl-project/sglang",
         "TensorRT-LLM": "https://github.com/NVIDIA/TensorRT-LLM", "llama.cpp": "https://github.com/ggml-org/llama.cpp"}


@dataclass(frozen=True)
class Mechanism:
    name: str
    page: str                    # where the playground shows it
    origin: str                  # the idea and where it was published
    where: dict[str, str]        # engine -> file or folder


MECHANISMS: tuple[Mechanism, ...] = (
    Mechanism("KV cache in pages (PagedAttention)", "The KV cache (paged against contiguous)",
              "PagedAttention, the vLLM paper (Kwon et al., SOSP 2023): fixed-size blocks and a block table per "
              "request, like virtual memory.",
              {"vLLM": "vllm/v1/core/kv_cache_manager.py, vllm/v1/core/block_pool.py",
               "SGLang": "python/sglang/srt/mem_cache/ (token-level memory pool and allocators)",
               "TensorRT-LLM": "cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp",
               "llama.cpp": "src/llama-kv-cache.cpp (a cache of cells shared by sequences)"}),
    Mechanism("Prefix caching (RadixAttention)",
              "not shown live yet; the KV cache page shows what each cached token costs",
              "RadixAttention, the SGLang paper (Zheng et al., 2024): cached prefixes in a radix tree, reused by any "
              "request that starts the same way. vLLM hashes full blocks instead.",
              {"vLLM": "vllm/v1/core/kv_cache_utils.py (block hashes), vllm/v1/core/kv_cache_manager.py",
               "SGLang": "python/sglang/srt/mem_cache/radix_cache.py",
               "TensorRT-LLM": "cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp (KV cache reuse)",
               "llama.cpp": "tools/server/server.cpp (each slot reuses its cached prompt)"}),
    Mechanism("Continuous batching", "Batching (simulated server; real batches here)",
              "Iteration-level scheduling, the Orca paper (Yu et al., OSDI 2022): the batch is rebuilt every step, "
              "so a finished request's place is taken at once.",
              {"vLLM": "vllm/v1/core/sched/scheduler.py",
               "SGLang": "python/sglang/srt/managers/scheduler.py",
               "TensorRT-LLM": "in-flight batching: cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp, "
                               "microBatchScheduler.cpp; tensorrt_llm/_torch/pyexecutor/py_executor.py",
               "llama.cpp": "tools/server/server.cpp (parallel slots decoded in one batch)"}),
    Mechanism("Speculative decoding", "Speculative decoding",
              "Leviathan et al. and Chen et al. (2023): a draft proposes, the target verifies in one pass, rejection "
              "sampling keeps its distribution. EAGLE and Medusa train small draft heads on the target's features.",
              {"vLLM": "vllm/v1/spec_decode/ (eagle.py, ngram_proposer.py, draft_model.py, medusa.py)",
               "SGLang": "python/sglang/srt/speculative/eagle_worker.py",
               "TensorRT-LLM": "tensorrt_llm/_torch/speculative/ (eagle3.py, mtp.py, ngram.py, draft_target.py)",
               "llama.cpp": "common/speculative.cpp"}),
    Mechanism("Fused attention (FlashAttention)", "FlashAttention and kernel fusion",
              "FlashAttention (Dao et al., 2022): tile Q, K and V through on-chip memory with an online softmax, so "
              "the N x N scores never reach HBM. FlashInfer and FlashAttention-2/3 are the kernels engines call.",
              {"vLLM": "vllm/v1/attention/backends/flash_attn.py, flashinfer.py",
               "SGLang": "python/sglang/srt/layers/attention/flashinfer_backend.py",
               "TensorRT-LLM": "cpp/tensorrt_llm/kernels/contextFusedMultiHeadAttention/",
               "llama.cpp": "ggml/src/ggml-cuda/fattn.cu (the -fa option)"}),
    Mechanism("Low-bit weights (FP8, INT4: GPTQ, AWQ, GGUF)", "Precision; Quantization, closely",
              "LLM.int8 (Dettmers et al., 2022) on outliers; GPTQ (Frantar et al., 2023) and AWQ (Lin et al., 2024) "
              "for 4-bit weights; FP8 tensor cores since H100.",
              {"vLLM": "vllm/model_executor/layers/quantization/ (fp8.py, gptq_marlin.py, awq_marlin.py)",
               "SGLang": "python/sglang/srt/layers/quantization/fp8.py",
               "TensorRT-LLM": "tensorrt_llm/quantization/mode.py (checkpoints from NVIDIA ModelOpt)",
               "llama.cpp": "ggml/src/ggml-quants.c (Q4_0, Q4_1, Q8_0, K-quants: the embedded model's format)"}),
)


def table(m: Mechanism) -> dict[str, list[str]]:
    return {"engine": list(ENGINES), "where to read": [m.where[e] for e in ENGINES]}
