"""Training steps of Hugging Face architectures (built from a config, random weights, offline):
GPT-2's language-model loss and BERT's sequence classification (one sequence padded), with MNCoreSGD (momentum),
against the same models trained with torch.optim.SGD on the host.

(SGD, not Adam: the attention's key bias has an exactly-zero gradient, which both sides compute
as rounding noise of about 1e-9; Adam divides by its root mean square, so those elements move by
the learning rate in directions the noise picks. Adam is tested on models without key biases.)"""

from __future__ import annotations

import pytest
import torch

from mlsdk import Context, MNCoreSGD, MNDevice

from .test_training import RTOL, assert_state_close, registered

transformers = pytest.importorskip("transformers")
STEPS = 3


def gpt2():
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=16,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return (lambda: transformers.GPT2LMHeadModel(config), {"input_ids": torch.randint(0, 50, (2, 8))},
            lambda m, d: m(input_ids=d["input_ids"], labels=d["input_ids"]).loss)


def bert():
    config = transformers.BertConfig(num_hidden_layers=1, num_attention_heads=2, hidden_size=16, intermediate_size=32,
                                     vocab_size=50, max_position_embeddings=16, num_labels=3,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return (lambda: transformers.BertForSequenceClassification(config),
            {"input_ids": torch.randint(0, 50, (2, 8)), "labels": torch.randint(0, 3, (2,)),
             "attention_mask": torch.tensor([[1] * 8, [1] * 5 + [0] * 3])},  # the second sequence padded
            lambda m, d: m(input_ids=d["input_ids"], attention_mask=d["attention_mask"], labels=d["labels"]).loss)


@pytest.mark.parametrize("architecture", [gpt2, bert], ids=["gpt2", "bert"])
def test_hugging_face_models_train_like_torch(architecture):
    torch.manual_seed(0)
    make, batch, loss_of = architecture()
    model, ref = make(), make()
    ref.load_state_dict(model.state_dict())
    model.train(), ref.train()
    ctx = Context(MNDevice("mini:auto"))
    optimizer = MNCoreSGD(model.parameters(), 0.1, 0.9)
    registered(ctx, model, optimizer)
    ref_optimizer = torch.optim.SGD(ref.parameters(), 0.1, 0.9)

    def train_step(inp):
        optimizer.zero_grad()
        loss = loss_of(model, inp)
        loss.backward()
        optimizer.step()
        return {"loss": loss}
    step = ctx.compile(train_step, batch, None)
    for _ in range(STEPS):
        loss = step(batch)["loss"].item()
        ref_optimizer.zero_grad()
        want = loss_of(ref, batch)
        want.backward()
        ref_optimizer.step()
        assert loss == pytest.approx(want.item(), rel=RTOL)
    ctx.synchronize()
    assert_state_close(model, ref, atol_floor=1e-7)
