"""SQuAD v1.1 and v2.0, one module per stage: reading.py (the JSON files, SquadExample), features.py (question +
context windows tokenized for BERT), answers.py (start/end logits back to answer text: n-best, null odds) and
scoring.py (the official exact match and F1); evaluate.py is `bertbench evaluate-squad`, the official
evaluate-v2.0.py's command."""
