"""Model families: Llama (dense) and Qwen3-style MoE, sharing one set of blocks."""
