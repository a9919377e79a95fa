"""The trainer's token log-probs skip the prompt columns no row trains on, and change nothing.

``token_logprobs`` computes logits only from the first column any row of the micro-batch trains
on (through ``logits_to_keep`` where the model's forward takes it); the log-probs, the full
tempered ones, the entropy and the gradient must be those of the whole forward, column for
column, with zeros before.
"""

from __future__ import annotations

import pytest
import torch

from astraflow.engines.config import TrainerConfig
from astraflow.engines.trainer_logprobs import token_logprobs


class NoKeep(torch.nn.Module):
    """The same model behind a forward that takes ``input_ids`` only (no ``logits_to_keep``)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids):
        return self.inner(input_ids=input_ids)


def batch(prompt_lens=(9, 6, 11), completion_lens=(5, 7, 3), vocab=40, seed=0, untrained=(0, 8)):
    """Right-padded rows of random ids and their completion masks [B, L - 1] (as ``collate``)."""
    g = torch.Generator().manual_seed(seed)
    width = max(p + c for p, c in zip(prompt_lens, completion_lens))
    ids = torch.zeros((len(prompt_lens), width), dtype=torch.long)
    mask = torch.zeros((len(prompt_lens), width - 1))
    for i, (p, c) in enumerate(zip(prompt_lens, completion_lens)):
        ids[i, : p + c] = torch.randint(3, vocab, (p + c,), generator=g)
        mask[i, p - 1: p - 1 + c] = 1.0
    if untrained is not None:
        mask[untrained] = 0.0  # a completion token that does not train (a tool's output, say)
    return ids, mask


def whole_forward(model, ids, mask, temperature):
    """The reference, independently: every column's logits, the tempered log-softmax, gathered."""
    logits = model(input_ids=ids).logits[:, :-1].float() / temperature
    all_logp = torch.log_softmax(logits, dim=-1)
    logp = all_logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    entropy = -(all_logp.exp() * all_logp).sum(-1)
    return torch.where(mask > 0, logp, 0.0), entropy


@pytest.fixture(scope="module")
def model(tiny_model_path):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(tiny_model_path), torch_dtype=torch.float32)
    m.eval()
    return m


def test_only_the_trained_columns_get_logits_and_the_values_are_the_whole_forwards(model):
    ids, mask = batch()
    cfg = TrainerConfig(temperature=0.7)
    shapes = []
    hook = model.lm_head.register_forward_hook(lambda mod, inp, out: shapes.append(tuple(out.shape)))
    try:
        logp, full, ent = token_logprobs(model, ids, mask, cfg, full=True, entropy=True)
    finally:
        hook.remove()
    first = 5  # row 1's prompt of 6 tokens: its first completion token is predicted at column 5
    # the head ran on the columns from `first` on only (plus the last, dropped as it predicts nothing)
    assert shapes == [(3, ids.shape[1] - first, model.config.vocab_size)]
    want_logp, want_ent = whole_forward(model, ids, mask, 0.7)
    assert logp.shape == full.shape == ent.shape == mask.shape
    torch.testing.assert_close(logp, want_logp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(full, want_logp, atol=1e-5, rtol=1e-5)  # no truncation: the same values
    torch.testing.assert_close(ent[:, first:], want_ent[:, first:], atol=1e-4, rtol=1e-4)
    assert not logp[:, :first].any() and not ent[:, :first].any()
    assert logp[1, first] != 0 and logp[0, 8] == 0  # trained there; not where the mask is 0


def test_a_model_without_logits_to_keep_gets_the_same_values_and_gradient(model):
    ids, mask = batch(seed=1)
    cfg = TrainerConfig(temperature=1.0, top_p=0.9)  # truncated: sampled and full differ
    grads = []
    for m in (model, NoKeep(model)):
        model.zero_grad()
        logp, full, _ = token_logprobs(m, ids, mask, cfg, full=True)
        (logp.sum() + 0.5 * full.sum()).backward()
        grads.append((logp.detach(), full.detach(), model.lm_head.weight.grad.clone(),
                      model.model.layers[0].mlp.up_proj.weight.grad.clone()))
    model.zero_grad()
    kept, plain = grads
    for a, b in zip(kept, plain):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert kept[2].abs().sum() > 0  # a gradient to compare at all
    assert not torch.equal(kept[0], kept[1])  # top-p 0.9 renormalises: sampled above full


def test_a_batch_that_trains_from_the_first_column_keeps_every_column(model):
    ids, mask = batch(prompt_lens=(1, 4), completion_lens=(6, 3), untrained=None)
    logp, _, _ = token_logprobs(model, ids, mask, TrainerConfig(temperature=1.0))
    want, _ = whole_forward(model, ids, mask, 1.0)
    torch.testing.assert_close(logp, want, atol=1e-5, rtol=1e-5)
    assert logp[0, 0] != 0
