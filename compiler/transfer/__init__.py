"""Moving tensors: between DRAM and LM layouts (staging), and between layouts (gather)."""
