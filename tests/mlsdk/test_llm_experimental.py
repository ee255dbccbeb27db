"""mlsdk.experimental.llm: PFN's llm_infer flow (prefill and decode compiled, the KV cache one
tensor between calls, the mask made on the host or on the device) gives the tokens of Hugging
Face's own greedy `generate`."""

from __future__ import annotations

import pytest
import torch

from mlsdk import ArgumentError, Context, MNDevice, UnsupportedOpError
from mlsdk.experimental.llm.attention_mask import prepare_4d_causal_attention_mask_with_cache_position
from mlsdk.experimental.llm.kv_cache import kv_cache_to_legacy, kv_cache_to_plamo, kv_cache_to_tensor

transformers = pytest.importorskip("transformers")
MAX_LENGTH, PROMPT, NEW_TOKENS = 12, 7, 3


def tiny_llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=63)
    return transformers.LlamaForCausalLM(config).eval()


def test_the_cache_as_one_tensor_round_trips():
    model = tiny_llama()
    with torch.no_grad():
        cache = model(input_ids=torch.randint(2, 60, (2, 5)), use_cache=True).past_key_values
    tensor = kv_cache_to_tensor(cache)
    assert tensor.shape == (2, 2, 2, 2, 5, 4)  # layers, key/value, batch, kv heads, sequence, head dim
    assert torch.equal(tensor[1, 1], cache.layers[1].values)
    assert torch.equal(kv_cache_to_tensor(kv_cache_to_legacy(tensor)), tensor)
    with pytest.raises(ArgumentError, match=r"kv_cache_to_legacy takes a \(layers, 2, batch"):
        kv_cache_to_legacy(tensor[0])
    with pytest.raises(UnsupportedOpError, match="PLaMo's KV cache format"):
        kv_cache_to_plamo(tensor)


def test_the_host_mask_is_the_models_own():
    """A left-padded batch gives the same logits at its tokens with the tokenizer's 2-D mask and
    with the 4-D mask made from it."""
    model = tiny_llama()
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    ids = torch.randint(2, 60, mask.shape) * mask
    positions = mask.cumsum(1)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        got = model(input_ids=ids, attention_mask=prepare_4d_causal_attention_mask_with_cache_position(
            mask, positions, model.dtype), position_ids=positions).logits
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()])


@pytest.mark.parametrize("mask_on_host", [False, True], ids=["2d_mask", "4d_mask_on_host"])
def test_prefill_and_decode_compiled_generate_hugging_faces_tokens(mask_on_host):
    model = tiny_llama()
    prompt = torch.randint(2, 60, (1, PROMPT))

    def forward(inputs):
        past = kv_cache_to_legacy(inputs["past_key_values"]) if "past_key_values" in inputs else None
        out = model.forward(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                            position_ids=inputs["position_ids"], past_key_values=past, use_cache=True)
        return {"logits": out.logits, "next_past_key_values": kv_cache_to_tensor(out.past_key_values)[:, :, :, :, 1:, :]}

    pad = MAX_LENGTH - PROMPT
    mask = torch.cat([torch.zeros(1, pad, dtype=torch.long), torch.ones(1, PROMPT, dtype=torch.long)], 1)
    inputs = {"input_ids": torch.cat([torch.zeros(1, pad, dtype=torch.long), prompt], 1), "attention_mask": mask,
              "position_ids": mask.cumsum(1)}
    if mask_on_host:
        inputs["attention_mask"] = prepare_4d_causal_attention_mask_with_cache_position(mask, inputs["position_ids"],
                                                                                        model.dtype)
    context = Context(MNDevice("mini:auto"))
    context.registry.register("model", model)
    compiled, tokens = {}, []
    for step in range(NEW_TOKENS):
        key = "prefill" if step == 0 else "decode"
        compiled.setdefault(key, context.compile(forward, inputs, None))
        outputs = compiled[key](inputs)
        with torch.no_grad():
            expected = forward(inputs)
        torch.testing.assert_close(outputs["logits"].cpu(), expected["logits"], rtol=1e-4, atol=1e-5)
        token = outputs["logits"].cpu().argmax(dim=2)[:, -1:]
        if mask_on_host:
            mask = torch.roll(inputs["attention_mask"][:, :, -1:, :], shifts=-1, dims=-1)
            mask[:, :, :, -1] = 0
        else:
            mask = torch.roll(inputs["attention_mask"], shifts=-1, dims=-1)
            mask[:, -1] = 1
        inputs = {"input_ids": token, "attention_mask": mask, "position_ids": inputs["position_ids"][:, -1:] + 1,
                  "past_key_values": outputs["next_past_key_values"].cpu()}
        tokens.append(int(token))
    assert set(compiled) == {"prefill", "decode"}
    assert tokens == model.generate(prompt, do_sample=False, max_new_tokens=NEW_TOKENS)[0, -NEW_TOKENS:].tolist()
