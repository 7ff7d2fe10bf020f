"""create_pretraining_data's parts (the command itself is bertbench.tasks.create_pretraining_data): settings.py (the
flags as DataSettings), corpus.py (the text read as a stream of chunks of documents), instances.py (Google's
create_training_instances on a chunk, run in the worker processes) and shards.py (NVIDIA's hdf5 shards, written in
whole compressed chunks, and where the output files go). None of them imports torch: every worker imports them."""
