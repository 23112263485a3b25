"""Conversations against transformers (tests/hugging_face/chat.sh runs it).

    chat_reference.py make FAMILY TEMPLATE FOLDER [FAMILY TEMPLATE FOLDER...]   a tokenizer of FAMILY's shape
                                                    (byte-level BPE with the family's special tokens) and TEMPLATE
                                                    as its chat template, in FOLDER
    chat_reference.py conversations FILE            the conversation set, as JSON lines
    chat_reference.py ids CONVERSATIONS FOLDER OURS [FOLDER OURS...]  apply_chat_template(tokenize=True)'s ids, and
                                                    masks by rendering the prefixes (return_assistant_tokens_mask
                                                    where the template has {% generation %}), equal fsdp-data's
    chat_reference.py model FOLDER                  a random Llama with that tokenizer, save_pretrained there
    chat_reference.py loss FOLDER CONVERSATIONS OURS SUMMARY...  transformers' loss over the answer tokens of
                                                    each conversation alone (labels -100 elsewhere) equals each
                                                    fsdp-train summary's final_loss within 1e-5
"""
import json
import sys

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers

# Each family's special tokens (the ones its template writes) and its bos/eos.
FAMILIES = {
    "llama3": (["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
               "<|begin_of_text|>", "<|eot_id|>"),
    "qwen2.5": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None, "<|im_end|>"),
    "qwen3": (["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"], None, "<|im_end|>"),
    "smollm3": (["<|im_start|>", "<|im_end|>", "<|endoftext|>"], None, "<|im_end|>"),
}

TEXT = ("The quick brown fox jumps over the lazy dog. Grüße aus Köln, 世界! Ça va? "
        "You are a helpful assistant. What is two plus two? It is four. system user assistant\n") * 40


def make(family, template_path, folder):
    specials, bos, eos = FAMILIES[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(f"{folder}/tokenizer.json")
    template = open(template_path, encoding="utf-8").read()
    config = {"chat_template": template, "eos_token": eos, "tokenizer_class": "PreTrainedTokenizerFast"}
    if bos:
        config["bos_token"] = bos
    json.dump(config, open(f"{folder}/tokenizer_config.json", "w"), ensure_ascii=False)


def conversation_set():
    return [
        [{"role": "user", "content": "What is two plus two?"}, {"role": "assistant", "content": "It is four."}],
        [{"role": "system", "content": "You are a helpful assistant."},
         {"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi! How can I help?"}],
        [{"role": "user", "content": "One"}, {"role": "assistant", "content": "Two"},
         {"role": "user", "content": "Three"}, {"role": "assistant", "content": "Four, and then five."}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Grüße, 世界! 🙂\nzweite Zeile"},
         {"role": "assistant", "content": "Ça va — ✓"}],
        [{"role": "user", "content": "Say nothing."}, {"role": "assistant", "content": ""},
         {"role": "user", "content": "Now say yes."}, {"role": "assistant", "content": "yes"}],
    ]


def tokenizer(folder):
    return transformers.AutoTokenizer.from_pretrained(folder)


def render(tok, messages, generation_prompt):
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def reference_mask(tok, messages):
    """The answer tokens: each assistant turn from where the conversation before it, rendered with the
    generation prompt, ends, to where it ends in the whole (the longest part of the turn rendered last
    that starts there), as fsdp/chat_encoding.h defines it; a token is marked if one of its characters is."""
    whole = render(tok, messages, False)
    marked = [False] * len(whole)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = render(tok, messages[:i], True)
        assert whole.startswith(before), f"message {i}: the prefix does not start the whole"
        last = render(tok, messages[:i + 1], False)[len(before):]
        rest = whole[len(before):]
        k = next((k for k in range(min(len(last), len(rest)), 0, -1) if rest[:k] == last[len(last) - k:]), 0)
        for c in range(len(before), len(before) + k):
            marked[c] = True
    encoding = tok(whole, add_special_tokens=False, return_offsets_mapping=True)
    return encoding["input_ids"], [int(any(marked[a:b])) for a, b in encoding["offset_mapping"]]


def ids_equal(folder, conversations_path, ours_path):
    tok = tokenizer(folder)
    bad = 0
    ours = [json.loads(line) for line in open(ours_path)]
    for n, (line, mine) in enumerate(zip(open(conversations_path), ours)):
        messages = json.loads(line)["messages"]
        ids = tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
        ref_ids, ref_mask = reference_mask(tok, messages)
        if "{% generation %}" in tok.chat_template:  # the template marks its answers: transformers' own masks
            ref_mask = tok.apply_chat_template(messages, tokenize=True, return_dict=True,
                                               return_assistant_tokens_mask=True)["assistant_masks"]
        if ids != ref_ids:
            print(f"conversation {n}: apply_chat_template's ids differ from the rendering's encoding", file=sys.stderr)
            bad += 1
        if mine["ids"] != ids:
            print(f"conversation {n}: ids differ:\n ours {mine['ids']}\n theirs {ids}", file=sys.stderr)
            bad += 1
        elif mine["loss_mask"] != ref_mask:
            print(f"conversation {n}: masks differ:\n ours {mine['loss_mask']}\n theirs {ref_mask}", file=sys.stderr)
            bad += 1
    print(f"{folder}: {len(ours) - bad} of {len(ours)} conversations: ids and masks equal")
    return 1 if bad or len(ours) != len(conversation_set()) else 0


def make_model(folder):
    torch.manual_seed(0)
    vocab = tokenizer(folder).vocab_size + 16
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                      vocab_size=vocab, rms_norm_eps=1e-5, rope_theta=10000.0,
                                      tie_word_embeddings=False)
    transformers.LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)


def loss(folder, ours_path, summaries):
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    total, count = 0.0, 0
    with torch.no_grad():
        for line in open(ours_path):
            c = json.loads(line)
            ids = torch.tensor([c["ids"]])
            labels = torch.tensor([[t if m else -100 for t, m in zip(c["ids"], c["loss_mask"])]])
            logits = model(ids).logits[0, :-1].double()
            total += torch.nn.functional.cross_entropy(logits, labels[0, 1:], reduction="sum").item()
            count += int((labels[0, 1:] != -100).sum())
    theirs = total / count
    bad = 0
    for summary in summaries:
        mine = json.load(open(summary))["final_loss"]
        ok = abs(mine - theirs) <= 1e-5 * abs(theirs)
        print(f"{summary}: fsdp-train {mine:.9f}, transformers {theirs:.9f} over {count} answer tokens"
              f" ({'equal' if ok else 'DIFFERENT'} within 1e-5)")
        bad += not ok
    return 1 if bad else 0


def main(argv):
    command = argv[1]
    if command == "make":  # one process for every folder: importing transformers is most of a run
        for i in range(2, len(argv), 3):
            make(argv[i], argv[i + 1], argv[i + 2])
        return 0
    if command == "conversations":
        with open(argv[2], "w", encoding="utf-8") as out:
            for messages in conversation_set():
                out.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")
        return 0
    if command == "ids":
        return max(ids_equal(argv[i], argv[2], argv[i + 1]) for i in range(3, len(argv), 2))
    if command == "model":
        return make_model(argv[2])
    if command == "loss":
        return loss(argv[2], argv[4], argv[5:])
    raise SystemExit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv) or 0)
