"""The transformers + bitsandbytes side of ctest qlora_bnb_folder (bnb_folder.sh).

  bnb_reference.py make DIR             a small random Llama (seeded) saved with save_pretrained as DIR/base (fp32),
                                        then loaded with BitsAndBytesConfig(load_in_4bit, nf4, double quantization)
                                        and saved again: DIR/bnb, a -bnb-4bit folder as the hub's
  bnb_reference.py records CKPT BNB     our sharded checkpoint's NF4 records (36 bytes a block: 32 packed bytes, the
                                        fp32 absmax) against BNB's packed weights and their absmax as bitsandbytes
                                        expands them, byte for byte
  bnb_reference.py peft-compare BNB ADAPTER LOGITS.json
                                        PeftModel.from_pretrained on BNB loaded 4-bit (bitsandbytes' forward,
                                        computing in fp32): its logits against the JSON's (ours, from the merged
                                        export) within 1e-5; prints the difference with bf16 compute too
Several commands in one run, between "+".
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # bitsandbytes compiles its portable kernels otherwise

import bitsandbytes as bnb
import torch
import transformers
from safetensors.torch import load_file

transformers.logging.set_verbosity_error()
TOLERANCE = 1e-5


def bnb_config(compute):
    return transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                           bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=compute)


def load_4bit(folder, compute):
    kwargs = {} if "quantization_config" in json.load(open(os.path.join(folder, "config.json"))) \
        else {"quantization_config": bnb_config(compute)}
    if kwargs:
        return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, device_map="cpu", **kwargs)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, device_map="cpu")
    for module in model.modules():  # the saved folder's compute dtype, overridden
        if isinstance(module, bnb.nn.Linear4bit):
            module.compute_dtype = compute
            module.compute_type_is_set = True
            # On a CPU with AVX-512 BF16, bitsandbytes' inference repacks the
            # weights for a kernel that computes in bf16 whatever the compute
            # dtype: fp32 compute is its dequantize-then-matmul path.
            module.support_avx512bf16_for_cpu = compute == torch.bfloat16 and module.support_avx512bf16_for_cpu
    return model


def make(folder):
    torch.manual_seed(60)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                      vocab_size=300, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
                                      tie_word_embeddings=False)
    transformers.LlamaForCausalLM(config).save_pretrained(f"{folder}/base")
    load_4bit(f"{folder}/base", torch.float32).save_pretrained(f"{folder}/bnb")
    return 0


def records(ckpt, bnb):
    import bitsandbytes.functional as F
    meta = json.load(open(os.path.join(ckpt, "metadata.json")))
    shards = [load_file(os.path.join(ckpt, f"shard-{q}.safetensors")) for q in range(meta["shard_group_size"])]
    theirs = load_file(os.path.join(bnb, "model.safetensors"))
    checked = failures = 0
    for u, unit in enumerate(meta["units"]):
        if not unit.get("nf4"):
            continue
        ours = torch.cat([s[f"u{u}.param"] for s in shards]).view(-1, 36)
        for p in unit["params"]:
            n = 1
            for d in p["shape"]:
                n *= d
            blocks = ours[p["offset"] // 64: p["offset"] // 64 + (n + 63) // 64]
            packed = theirs[p["name"]].view(-1)
            state = json.loads(bytes(theirs[p["name"] + ".quant_state.bitsandbytes__nf4"].tolist()).decode())
            code = theirs[p["name"] + ".nested_quant_map"]
            nested = F.QuantState(absmax=theirs[p["name"] + ".nested_absmax"], code=code, blocksize=256,
                                  dtype=torch.float32)
            absmax = F.dequantize_blockwise(theirs[p["name"] + ".absmax"], nested) + state["nested_offset"]
            same = torch.equal(blocks[:, :32].reshape(-1)[: packed.numel()], packed) and \
                torch.equal(blocks[:, 32:].contiguous().view(torch.float32).view(-1), absmax)
            checked += 1
            if not same:
                failures += 1
                print(f"FAIL {p['name']}: our records differ from bitsandbytes' bytes", file=sys.stderr)
    print(f"NF4 records: {checked - failures} of {checked} weights equal bitsandbytes' codes and absmax")
    return 1 if failures or not checked else 0


def peft_compare(bnb, adapter, logits_path):
    import peft
    with open(logits_path) as f:
        theirs = json.load(f)
    tokens = torch.tensor([theirs["tokens"]])
    expected = torch.tensor(theirs["logits"])
    diffs = {}
    for name, compute in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        model = peft.PeftModel.from_pretrained(load_4bit(bnb, compute), adapter)
        model.eval()
        with torch.no_grad():
            logits = model(tokens).logits[0].float()
        diffs[name] = (logits - expected).abs().max().item()
    print(f"max abs logit difference against PEFT on the 4-bit base: {diffs['float32']:.3g} computing in fp32, "
          f"{diffs['bfloat16']:.3g} in bf16 (bitsandbytes' CPU kernel; logits up to {expected.abs().max().item():.3g})")
    return 0 if diffs["float32"] <= TOLERANCE else 1


COMMANDS = {"make": (make, 1), "records": (records, 2), "peft-compare": (peft_compare, 3)}

if __name__ == "__main__":
    args = sys.argv[1:]
    status = 0
    while args:
        name, args = args[0], args[1:]
        function, count = COMMANDS[name]
        status |= function(*args[:count])
        args = args[count:]
        if args and args[0] == "+":
            args = args[1:]
    sys.exit(status)
