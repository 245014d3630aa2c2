"""What the seam (grpo_exp.trainer.seam, with trl_surface) touches of TRL 1.16's GRPOTrainer, declared for
tests/test_trl_contract.py, which checks each name against the installed TRL and names whatever an upgrade moved."""

# TRL's methods the seam overrides or calls, with the leading parameters it passes them, in order.
TRL_METHODS = {
    "_calculate_rewards": ("inputs", "prompts", "completions", "completion_ids_list"),
    "_generate_and_score_completions": ("inputs",),
    "_generate_single_turn": ("prompt_ids", "images", "multimodal_fields", "num_generations", "has_tool_images"),
    "_get_per_token_logps_and_entropies": (
        "model",
        "input_ids",
        "attention_mask",
        "logits_to_keep",
        "batch_size",
        "compute_entropy",
        "compute_aux_loss",
    ),
    "compute_loss": ("model", "inputs", "return_outputs", "num_items_in_batch"),
    "_compute_loss": ("model", "inputs"),
    "_save_checkpoint": ("model", "trial"),
    "_tokenize_prompts": ("prompts",),
}
# The trainer's attributes the seam reads (dotted: an attribute of one).
TRL_ATTRIBUTES = tuple(
    """
    _logs _metrics _entropy_bonus_enabled aux_loss_enabled beta top_entropy_quantile use_vllm
    args.use_transformers_paged loss_type multi_objective_aggregation reward_func_names reward_weights
    num_generations generation_config generation_kwargs max_completion_length temperature epsilon_low
    epsilon_high args.ds3_gather_for_generation model_wrapped is_deepspeed_enabled is_fsdp_enabled
    callback_handler.callbacks environments scale_rewards vllm_importance_sampling_correction
    top_p
    """.split()
)
# What TRL's __init__ sets only with use_vllm (generation=vllm_*): checked in its source, not on a trainer.
TRL_VLLM_ATTRIBUTES = ("vllm_generation", "_last_loaded_step")
# The module constant TRL's fused LM head reads its token tile from, at every call (grpo_exp.trainer.lm_head_tile).
TRL_LM_HEAD_TILE = ("trl.kernels.chunked_logprob", "TOKEN_CHUNK_SIZE")
# The function TRL's fused LM head asks, at each call, whether to score only the labelled positions ("compact"): its
# one use in that module (grpo_exp.trainer.lm_head_positions answers yes on CPU too).
TRL_LM_HEAD_COMPACT = ("trl.trainer.utils", "_use_triton")
# TRL's vLLM generation, which grpo_exp.trainer.vllm_reload subclasses and builds by these module names.
TRL_VLLM_GENERATION = {
    "trl.trainer.grpo_trainer": ("VLLMGeneration",),
    "trl.generation.vllm_generation": ("LLM", "VLLMGeneration"),
}
VLLM_GENERATION_METHODS = ("_init_vllm", "sync_weights", "_iter_named_params", "generate")
# What grpo_exp.trainer.async_generation reads of it to send a server TRL's own request (set in its __init__).
VLLM_GENERATION_ATTRIBUTES = tuple(
    """
    accelerator mode server_base_url server_host server_port repetition_penalty temperature top_p top_k min_p
    max_completion_length logprobs structured_outputs_regex generation_kwargs
    """.split()
)
# transformers' Trainer's public surface the seam reads (tests/test_trl_contract.py derives every name the seam and
# trl_surface read from their source, and fails on one declared nowhere here)
TRL_PUBLIC = ("accelerator", "model", "processing_class", "save_model", "state", "train_dataset")
