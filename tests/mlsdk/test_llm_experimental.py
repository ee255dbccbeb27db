"""mlsdk.experimental.llm: PFN's llm_infer flow (prefill and decode compiled, the KV cache one
tensor between calls, the mask made on the host or on the device) gives the tokens of Hugging
Face's own greedy `generate`; compile_pp_llama's flow (the model split into pipeline stages, each
compiled in a Context of its own) gives the whole model's logits and cache."""

from __future__ import annotations

import pytest
import torch

from mlsdk import ArgumentError, Context, MNDevice, UnsupportedOpError
from mlsdk.experimental.llm.attention_mask import prepare_4d_causal_attention_mask_with_cache_position
from mlsdk.experimental.llm.kv_cache import kv_cache_to_legacy, kv_cache_to_plamo, kv_cache_to_tensor
from mlsdk.experimental.llm.modeling_staged_llama import split_llama

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


def _stage_forward(stage: int, stages: int):
    """The function compile_pp_llama compiles for a stage: a decoder stage takes the cache as one
    tensor and returns it so, its oldest position dropped (a static length)."""
    def forward(inputs, model):
        if 0 < stage < stages - 1:
            inputs["past_key_values"] = kv_cache_to_legacy(inputs["past_key_values"]) if "past_key_values" in inputs \
                else None
            outputs = model(**inputs)
            outputs["past_key_values_out"] = kv_cache_to_tensor(outputs["past_key_values_out"])[:, :, :, :, 1:, :]
            return outputs
        return model(**inputs)
    return forward


def _run_pipeline(stages, inputs: dict, per_stage: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each stage compiled on mini in a Context of its own, fed the previous stage's outputs as
    compile_pp_llama feeds them; the logits and the decoder stages' caches, concatenated."""
    h, caches = None, []
    for stage, model in enumerate(stages):
        context = Context(MNDevice("mini:auto"))
        Context.switch_context(context)
        context.registry.register("model", model)
        if stage == 0:
            fed = {"input_ids": inputs["input_ids"], "position_ids": inputs["position_ids"]}
        elif stage == len(stages) - 1:
            fed = {"hidden_states": h["hidden_states_out"]}
        else:
            fed = {"hidden_states": h["hidden_states_out"], "position_embeddings_cos": h["position_embeddings_cos_out"],
                   "position_embeddings_sin": h["position_embeddings_sin_out"],
                   "attention_mask": inputs["attention_mask"], "position_ids": inputs["position_ids"]}
            if "past_key_values" in inputs:
                fed["past_key_values"] = inputs["past_key_values"][per_stage * (stage - 1):per_stage * stage]
        forward = _stage_forward(stage, len(stages))
        h = {k: v.cpu() for k, v in context.compile(lambda d, m=model: forward(d, m), fed, None)(fed).items()}
        context.invalidate()
        if "past_key_values_out" in h:
            caches.append(h["past_key_values_out"])
    return h["logits"], torch.cat(caches)


def test_split_llama_stages_compiled_one_by_one_give_the_whole_models_logits_and_cache():
    """Three layers over two decoder stages (2 + 1): a prefill with the causal mask made on the
    host, then a decode step from that cache, each against the unsplit model."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    model = transformers.LlamaForCausalLM(config).eval()
    stages = split_llama(model, 4)
    assert [type(s).__name__ for s in stages] == ["EmbeddingStage", "DecoderStage", "DecoderStage", "HeadStage"]
    assert [len(s.layers) for s in stages[1:3]] == [2, 1]
    ones = torch.ones(1, MAX_LENGTH, dtype=torch.long)
    positions = ones.cumsum(1)
    prefill = {"input_ids": torch.randint(2, 60, (1, MAX_LENGTH)), "position_ids": positions,
               "attention_mask": prepare_4d_causal_attention_mask_with_cache_position(ones, positions, torch.float32)}
    with torch.no_grad():
        whole = model(input_ids=prefill["input_ids"], position_ids=positions, use_cache=True)
    logits, cache = _run_pipeline(stages, prefill, per_stage=2)
    torch.testing.assert_close(logits, whole.logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(cache, kv_cache_to_tensor(whole.past_key_values)[:, :, :, :, 1:, :], rtol=1e-4, atol=1e-5)

    token = whole.logits.argmax(2)[:, -1:]
    decode = {"input_ids": token, "position_ids": positions[:, -1:] + 1, "past_key_values": cache,
              "attention_mask": torch.zeros(1, 1, 1, MAX_LENGTH)}  # every cached position and the new one
    with torch.no_grad():
        whole = model(input_ids=token, position_ids=decode["position_ids"], past_key_values=kv_cache_to_legacy(cache),
                      use_cache=True)
    logits, cache = _run_pipeline(stages, decode, per_stage=2)
    torch.testing.assert_close(logits, whole.logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(cache, kv_cache_to_tensor(whole.past_key_values)[:, :, :, :, 1:, :], rtol=1e-4, atol=1e-5)


def test_split_llama_refuses_what_it_cannot_split():
    model = tiny_llama()  # two layers
    with pytest.raises(ArgumentError, match="n_stages=2; it needs at least 3"):
        split_llama(model, 2)
    with pytest.raises(ArgumentError, match=r"2 layers in 3 decoder stages of 1 leave stage\(s\) \[3\] without a layer; "
                                            "use at most 4 stages"):
        split_llama(model, 5)
    with pytest.raises(ArgumentError, match=r"Linear has no model.embed_tokens \(token embedding\)"):
        split_llama(torch.nn.Linear(2, 2), 3)
    stages = split_llama(model, 4)  # one layer each; the model's own modules, shared
    assert stages[1].layers[0] is model.model.layers[0] and stages[3].lm_head is model.lm_head
    h = torch.zeros(1, 1, 16)
    cos = sin = torch.zeros(1, 1, 4)
    two_layers = tuple((torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4)) for _ in range(2))
    with pytest.raises(ArgumentError, match=r"decoder stage of layers 1..1: past_key_values holds 2 layers, not 1"):
        stages[2](h, cos, sin, past_key_values=two_layers)
