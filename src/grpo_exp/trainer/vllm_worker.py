"""Runs inside vLLM's worker (in the training process for a colocated engine; in the server's, loaded by
`--worker-extension-cls grpo_exp.trainer.vllm_worker.PolicyReload`): a weight reload that leaves no stale kernel.

vLLM's `reload_weights` re-processes each layer whose weights it loads. A tied output layer (SmolLM2's lm_head shares
the embedding) loads none of its own, so on CPU it keeps the oneDNN GEMM it prepacked from the old weights: measured
here, every layer but the embedding matched the trainer's log-probabilities after a reload (5e-6 a token) and the
embedding's change was lost to the logits (0.016 a token). Re-processing the tied layer from the reloaded weight
fixes it. Imports nothing of grpo_exp: the server imports this module alone."""


def reload_policy(worker, weights_iterator=None, weights_path=None) -> None:
    """vLLM's reload (from `weights_iterator`, or from the safetensors in `weights_path`), then the tied head's
    processing redone from the reloaded embedding."""
    runner = worker.model_runner
    runner.reload_weights(weights_iterator=weights_iterator, weights_path=weights_path)
    model = runner.get_model()
    head, embedding = getattr(model, "lm_head", None), getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is not None and embedding is not None and getattr(head, "weight", None) is embedding.weight:
        head.quant_method.process_weights_after_loading(head)


class PolicyReload:
    """vLLM worker extension: POST /collective_rpc {"method": "reload_policy", "kwargs": {"weights_path": DIR}}."""

    def reload_policy(self, weights_path: str) -> None:
        reload_policy(self, weights_path=weights_path)
