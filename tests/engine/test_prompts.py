"""Prompt rendering in TRL's standard and conversational formats, truncation, stop ids."""

import pytest
from transformers import AutoTokenizer, GenerationConfig

from workbench.engine.prompts import (
    encode_prompts,
    is_conversational,
    left_truncate,
    merge_eos_ids,
    render_prompt,
    stop_token_ids,
)

QUESTION = [{"role": "user", "content": "What is 7 + 5?"}]


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    """SmolLM2's real tokenizer (chat template with <|im_start|> / <|im_end|>)."""
    return AutoTokenizer.from_pretrained(smollm2_dir)


def test_conversational_prompts_render_exactly_as_the_chat_template(tokenizer):
    expected_text = tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    expected_ids = tokenizer.apply_chat_template(QUESTION, tokenize=True, add_generation_prompt=True, return_dict=True)
    enc = encode_prompts(tokenizer, [QUESTION])
    assert enc.texts == [expected_text]
    assert expected_text.endswith("<|im_start|>assistant\n")
    assert enc.input_ids == [list(expected_ids["input_ids"])]
    assert enc.num_truncated == 0


def test_a_system_prompt_leads_the_conversation_and_replaces_the_datasets(tokenizer):
    system = {"role": "system", "content": "Answer with a number."}
    expected = tokenizer.apply_chat_template([system, *QUESTION], tokenize=False, add_generation_prompt=True)
    assert render_prompt(tokenizer, QUESTION, system_prompt="Answer with a number.") == expected
    own = [{"role": "system", "content": "Be verbose."}, *QUESTION]
    assert render_prompt(tokenizer, own, system_prompt="Answer with a number.") == expected
    assert "Be verbose." in render_prompt(tokenizer, own)  # no system_prompt: the dataset's stays


def test_standard_prompts_are_tokenised_as_text_not_templated(tokenizer):
    enc = encode_prompts(tokenizer, ["7+5="])
    assert enc.texts == ["7+5="]
    assert enc.input_ids == [tokenizer("7+5=")["input_ids"]]
    with pytest.raises(ValueError, match="system_prompt needs conversational prompts"):
        render_prompt(tokenizer, "7+5=", system_prompt="Be brief.")


def test_both_formats_in_one_batch(tokenizer):
    enc = encode_prompts(tokenizer, ["7+5=", QUESTION])
    assert enc.texts[0] == "7+5=" and enc.texts[1].startswith("<|im_start|>system\n")


def test_a_repeated_prompt_is_encoded_once_with_each_row_as_alone(tokenizer):
    """GRPO's G copies: one render and one tokenisation per distinct prompt, the rows unchanged."""
    calls = []

    class Counting:  # the real tokenizer, its calls counted
        def __getattr__(self, name):
            return getattr(tokenizer, name)

        def __call__(self, text, **kw):
            calls.append(text)
            return tokenizer(text, **kw)

    other = [{"role": "user", "content": "What is 2 + 2?"}]
    prompts = [QUESTION, "7+5=", QUESTION, other, "7+5=", QUESTION]
    enc = encode_prompts(Counting(), prompts, system_prompt=None, max_prompt_length=12)
    alone = [encode_prompts(tokenizer, [p], max_prompt_length=12) for p in prompts]
    assert enc.texts == [a.texts[0] for a in alone] and enc.input_ids == [a.input_ids[0] for a in alone]
    assert enc.num_truncated == sum(a.num_truncated for a in alone) == 4  # the chat prompts exceed 12 tokens
    assert len(calls) == 3
    assert len({id(row) for row in enc.input_ids}) == len(prompts)  # no row shares its list with another


def test_left_truncation_keeps_the_last_tokens():
    assert left_truncate([11, 12, 13, 14, 15], 3) == [13, 14, 15]
    assert left_truncate([11, 12, 13], 3) == [11, 12, 13]
    assert left_truncate([11, 12], None) == [11, 12]
    with pytest.raises(ValueError, match="max_prompt_length=0"):
        left_truncate([11], 0)


def test_max_prompt_length_truncates_on_the_left_and_counts(tokenizer):
    long_ids = tokenizer(" one two three four five six")["input_ids"]
    short_ids = tokenizer(" one two")["input_ids"]
    assert len(long_ids) == 6 and len(short_ids) == 2  # one token per word in SmolLM2's BPE
    enc = encode_prompts(tokenizer, [" one two three four five six", " one two"], max_prompt_length=4)
    assert enc.input_ids == [long_ids[2:], short_ids]
    assert tokenizer.decode(enc.input_ids[0]) == " three four five six"
    assert enc.num_truncated == 1


def test_generation_stops_at_smollm2s_end_of_turn(tokenizer, smollm2_dir):
    ids = stop_token_ids(tokenizer, GenerationConfig.from_pretrained(smollm2_dir))
    assert ids == [2] and tokenizer.convert_ids_to_tokens(2) == "<|im_end|>"


def test_eos_ids_merge_tokenizer_first_without_duplicates():
    assert merge_eos_ids(2, [2, 7]) == [2, 7]
    assert merge_eos_ids(3, [1, 3]) == [3, 1]
    assert merge_eos_ids(None, 5) == [5]
    assert merge_eos_ids(0, None) == [0]


def test_bad_prompts_are_refused_with_the_reason(tokenizer):
    assert is_conversational(QUESTION) and not is_conversational("hi") and not is_conversational([])
    with pytest.raises(ValueError, match="neither text .* nor a list of"):
        render_prompt(tokenizer, ["just", "strings"])
    no_template = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    no_template.chat_template = None
    with pytest.raises(ValueError, match="has no chat template"):
        render_prompt(no_template, QUESTION)


def test_completion_masks_stop_at_the_first_of_several_stop_ids():
    import torch

    from workbench.engine.rollout import completion_mask_from_ids

    ids = torch.tensor([[5, 2, 7, 9], [1, 1, 1, 1], [9, 3, 2, 2]])
    mask, truncated = completion_mask_from_ids(ids, [2, 9])  # EOS and end-of-turn
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert truncated.tolist() == [False, True, False]
    assert completion_mask_from_ids(ids, 9)[0].tolist() == [[1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 0, 0]]


def test_a_batch_is_left_padded_and_counts_truncated_prompts(tokenizer):
    from workbench.engine.rollout import encode_batch

    side, tokenizer.padding_side = tokenizer.padding_side, "right"  # encode_batch pads left regardless
    try:
        ids, mask, cut = encode_batch(tokenizer, ["Hi", QUESTION], max_prompt_length=8)
        assert tokenizer.padding_side == "right"
    finally:
        tokenizer.padding_side = side
    assert ids.shape == mask.shape == (2, 8) and cut == 1
    assert mask[0].tolist() == [0] * (8 - int(mask[0].sum())) + [1] * int(mask[0].sum())
    assert tokenizer.decode(ids[1]).endswith("<|im_start|>assistant\n")
