"""The method: the seam, the attention maths, the measures, and everything of one recorded pass (the
Analysis, its row blocks, spill, memory check, interventions, log-probabilities, export). See cwviz/core/__init__.py."""
