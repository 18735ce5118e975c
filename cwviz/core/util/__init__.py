"""Services that know neither models nor the method: errors, progress, tokens for display, prompt files, settings,
file locks, the process's heap, accelerate's process state. See cwviz/core/__init__.py."""
