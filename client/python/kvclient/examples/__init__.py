"""Examples and reference engines for kvclient (see llama.py)."""
