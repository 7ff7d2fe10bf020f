"""The named BERT shapes: what `--model tiny|mini|base|large` means to the benches, and the shape the built-in SQuAD
data trains. Each is a set of BertConfig fields; any bert_config.json / HF config.json path works where a name does.
"tiny" is also the tests' and the demo's debug size."""

MODEL_SIZES = {
    "tiny": {
        "vocab_size": 1024,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 256,
    },
    "mini": {
        "vocab_size": 30522,
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "intermediate_size": 1024,
    },
    "base": {
        "vocab_size": 30522,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
    },
    "large": {
        "vocab_size": 30522,
        "hidden_size": 1024,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "intermediate_size": 4096,
    },
}

# The model the built-in SQuAD data trains (tasks/synthetic.py; the demo's QA step, `bench finetuning --task squad`):
# matching a question's words to the paragraph's needs attention heads of 32 dimensions, and a from-scratch model on
# synthetic data learns faster without dropout (nothing here overfits). Its vocab_size is the synthetic vocabulary's.
SQUAD_MODEL = {
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 512,
    "max_position_embeddings": 64,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
