"""Loading a model: the architectures table and derived rows, the checkpoints converted once into the cache,
load_model and the Bundle, a prompt's and a selection's checks, greedy continuation, a run's provenance. See
cwviz/core/__init__.py."""
