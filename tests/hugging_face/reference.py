"""The transformers side of the Hugging Face checks (tests/hugging_face/run.sh).

  reference.py make gpt2|llama DIR     a small randomly initialised model, seeded, saved with save_pretrained
  reference.py compare DIR LOGITS.json  from_pretrained(DIR) (no missing or unexpected keys), its logits for the
                                        JSON's tokens against the JSON's, in float32; prints the max abs difference
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

try:
    import torch
    import transformers
except ImportError as e:  # run.sh turns this into a skip (77) unless CI is set
    print(f"reference.py: {e}", file=sys.stderr)
    sys.exit(77)

transformers.logging.set_verbosity_error()
TOLERANCE = 1e-5


def make(kind, folder):
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=32, vocab_size=300,
                                         activation_function="gelu_new", bos_token_id=299, eos_token_id=299)
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                          vocab_size=300, rms_norm_eps=1e-5, rope_theta=10000.0,
                                          tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
        model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():  # biases and norms away from their zeros and ones, so that a mix-up shows
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(folder, safe_serialization=True)


def compare(folder, logits_path):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True,
                                                                     torch_dtype=torch.float32)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        print(f"from_pretrained({folder}) reports {problems}", file=sys.stderr)
        return 1
    model.eval()
    with open(logits_path) as f:
        theirs = json.load(f)
    tokens = torch.tensor([theirs["tokens"]])
    with torch.no_grad():
        ours = model(tokens).logits[0]
    diff = (ours - torch.tensor(theirs["logits"])).abs().max().item()
    print(f"max abs logit difference {diff:.3g} over {ours.numel()} logits ({type(model).__name__})")
    return 0 if diff <= TOLERANCE else 1


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(f"unknown command {sys.argv[1]}")
