"""Public `config.json` files of popular open models, as published on the Hugging Face hub.

Only the fields that decide the architecture are kept (token ids, initialisation and dropout are
left out); every value is the checkpoint's own. Keys the checkpoint leaves out are left out here
too, so transformers' `AutoConfig` fills them with that model type's defaults, exactly as it does
for the real file (Gemma 2 9B's `config.json` has no `tie_word_embeddings`: Gemma ties them).
`engine.projection.specs` turns each into a `ModelSpec` preset; tests recompute their figures by hand.
"""
from __future__ import annotations

from typing import Any

LLAMA_31_ROPE = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 8192, "rope_type": "llama3"}


def _llama31(hidden: int, intermediate: int, layers: int, heads: int) -> dict[str, Any]:
    """meta-llama/Llama-3.1-{8B,70B,405B}: the three differ only in these four numbers."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
            "intermediate_size": intermediate, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
            "rope_theta": 500000.0, "rope_scaling": LLAMA_31_ROPE, "tie_word_embeddings": False,
            "attention_bias": False, "mlp_bias": False, "rms_norm_eps": 1e-05, "torch_dtype": "bfloat16"}


PUBLIC_CONFIGS: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": _llama31(4096, 14336, 32, 32),
    "llama-3.1-70b": _llama31(8192, 28672, 80, 64),
    "llama-3.1-405b": _llama31(16384, 53248, 126, 128),
    # mistralai/Mistral-7B-v0.1: every layer attends to a 4,096-token sliding window.
    "mistral-7b-v0.1": {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 32768,
        "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": False,
        "rms_norm_eps": 1e-05, "torch_dtype": "bfloat16"},
    # mistralai/Mixtral-8x7B-v0.1: 8 experts per layer, 2 routed per token.
    "mixtral-8x7b": {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000,
        "max_position_embeddings": 32768, "rope_theta": 1000000.0, "sliding_window": None,
        "tie_word_embeddings": False, "rms_norm_eps": 1e-05, "torch_dtype": "bfloat16"},
    # Qwen/Qwen3-30B-A3B: 128 small experts, 8 routed per token, no shared expert.
    "qwen3-30b-a3b": {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
        "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
        "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
        "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000.0,
        "use_sliding_window": False, "sliding_window": None, "max_window_layers": 48,
        "tie_word_embeddings": False, "attention_bias": False, "rms_norm_eps": 1e-06,
        "torch_dtype": "bfloat16"},
    # deepseek-ai/DeepSeek-V3: multi-head latent attention; 3 dense layers, then 58 MoE layers of
    # 256 routed experts (8 per token) plus 1 shared. The multi-token-prediction module
    # (num_nextn_predict_layers) is a separate 14 B add-on and not part of the 671 B.
    "deepseek-v3": {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
        "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
        "num_attention_heads": 128, "num_key_value_heads": 128, "n_routed_experts": 256,
        "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
        "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
        "norm_topk_prob": True, "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
        "max_position_embeddings": 163840, "rope_theta": 10000,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
        "num_nextn_predict_layers": 1, "tie_word_embeddings": False, "attention_bias": False,
        "rms_norm_eps": 1e-06, "torch_dtype": "bfloat16",
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "weight_block_size": [128, 128]}},
    # google/gemma-2-9b: no tie_word_embeddings key (Gemma ties them); sliding window of 4,096 on
    # every other layer.
    "gemma-2-9b": {
        "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 3584,
        "intermediate_size": 14336, "num_hidden_layers": 42, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 256, "vocab_size": 256000, "max_position_embeddings": 8192,
        "rope_theta": 10000.0, "sliding_window": 4096, "query_pre_attn_scalar": 256,
        "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "attention_bias": False,
        "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-06, "cache_implementation": "hybrid",
        "torch_dtype": "float32"},
    # google/gemma-3-27b-it: a vision-language checkpoint; the decoder sits in text_config, whose
    # unset keys (vocabulary, context, the 5-local-to-1-global layer pattern) are Gemma 3 defaults.
    "gemma-3-27b": {
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "text_config": {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504,
                        "model_type": "gemma3_text", "num_attention_heads": 32, "num_hidden_layers": 62,
                        "num_key_value_heads": 16, "query_pre_attn_scalar": 168,
                        "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024},
        "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                          "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                          "patch_size": 14, "vision_use_head": False},
        "mm_tokens_per_image": 256, "torch_dtype": "bfloat16"},
    # meta-llama/Llama-4-Scout-17B-16E: every layer is MoE (16 experts, 1 routed + 1 shared);
    # three layers in four use chunked attention over 8,192-token chunks, the fourth is global.
    "llama-4-scout": {
        "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
        "text_config": {
            "model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192,
            "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
            "num_key_value_heads": 8, "head_dim": 128, "num_local_experts": 16, "num_experts_per_tok": 1,
            "interleave_moe_layer_step": 1, "attention_chunk_size": 8192, "use_qk_norm": True,
            "vocab_size": 202048, "max_position_embeddings": 10485760, "rope_theta": 500000.0,
            "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
            "attention_bias": False, "rms_norm_eps": 1e-05, "torch_dtype": "bfloat16"},
        "vision_config": {"model_type": "llama4_vision_model", "hidden_size": 1408, "num_hidden_layers": 34,
                          "num_attention_heads": 16, "intermediate_size": 5632, "image_size": 336,
                          "patch_size": 14},
        "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
}
