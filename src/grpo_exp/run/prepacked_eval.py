"""Held-out answers from the policy's prepacked float32 copy (eval.prepacked): the training sampler's machinery
(grpo_exp.trainer.sampling_copy), used for evaluation on CPU: greedy answers, and sampled ones (pass@k, the policy's
own answers that self-verification and the verification benchmark put to it).

The copy multiplies by the policy's own float32 weights, packed for MKL (or oneDNN); it is refreshed from the policy at
every call. Its logits differ from the policy's only by the rounding of another summation order, so greedy
answers are the same unless two tokens tie to within that rounding: measured identical on the 100 default
held-out problems (tests/test_validation.py, BENCHMARKS.md), at several times the speed of generate() on the
policy. Where the copy cannot serve (a GPU, non-float32 or LoRA weights, DeepSpeed's partitioned parameters, a CPU
or torch build without MKL or oneDNN), evaluation uses generate() on the policy, as before, and says why once.
"""

import copy
import logging
import weakref

import torch
from tqdm.auto import tqdm

from grpo_exp.trainer.prepacked_linear import prepack_unsupported
from grpo_exp.trainer.sampling_copy import SamplingCopy

log = logging.getLogger(__name__)

_copies: "weakref.WeakKeyDictionary[torch.nn.Module, SamplingCopy]" = weakref.WeakKeyDictionary()
_refusals_said: set[str] = set()


def prepack_refusal(model) -> str | None:
    """Why the prepacked copy cannot answer for `model`; None when it can."""
    if model.device.type != "cpu":
        return f"the policy is on {model.device.type}: it answers there, with generate()"
    if getattr(model, "peft_config", None):
        return "LoRA layers read their weights in their own forward"
    parameters = list(model.parameters())
    if any(hasattr(p, "ds_id") for p in parameters):
        return "DeepSpeed partitions the parameters"
    if any(p.dtype != torch.float32 for p in parameters):
        return "the policy's weights are not all float32"
    return prepack_unsupported(torch.float32)


def prepacked_copy(model, probe: list[int]) -> SamplingCopy | None:
    """The model's prepacked copy, made once and refreshed from its weights now; None (the reason logged once)
    where it cannot serve."""
    reason = prepack_refusal(model)
    if reason is None and model not in _copies:
        try:
            _copies[model] = SamplingCopy(model, torch.float32, prepack=True, probe=probe)
        except (RuntimeError, ValueError) as err:  # the kernels refused, or the logits moved: generate() answers
            reason = str(err)
    if reason is not None:
        if reason not in _refusals_said:
            _refusals_said.add(reason)
            log.info("Held-out answers from generate() on the policy, not its prepacked copy: %s", reason)
        return None
    sampling_copy = _copies[model]
    sampling_copy.sync(model, step=None)
    return sampling_copy


def release_prepacked(model) -> None:
    """The model's prepacked copy's weights freed until its next use (SamplingCopy.release): between evaluations a
    run trains, and the copy would add the policy's size to the step's peak."""
    if model in _copies:
        _copies[model].release()


@torch.no_grad()
def prepacked_completions(
    model, tokenizer, prompts: list, max_new_tokens: int, batch_size: int, desc: str | None, temperature: float = 0.0
) -> list[str] | None:
    """generate_completions' answers (the same batches, padding and generation settings: greedy at temperature 0,
    else sampled) from the prepacked copy; None where it cannot serve. Sampled, they are draws from the copy's
    distribution, which the training sampler draws from too, not generate()'s draws."""
    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    sampling_copy = prepacked_copy(model, ids[0]) if ids else None
    if sampling_copy is None:
        return None
    # generate()'s own settings: the model's generation config, with generate_completions' arguments over it
    settings = copy.deepcopy(model.generation_config)
    settings.update(
        do_sample=temperature > 0,
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        top_p=None,
        top_k=None,
    )
    settings.temperature = temperature or None
    completions: list[str] = []
    try:
        for start in tqdm(range(0, len(ids), batch_size), desc=desc, unit="batch", disable=desc is None):
            tokens, _ = sampling_copy.generate(ids[start : start + batch_size], settings, with_log_probs=False)
            completions += tokenizer.batch_decode(tokens, skip_special_tokens=True)
    finally:
        sampling_copy.release()
    return completions
