"""A Hugging Face Llama from a small config (random weights, nothing downloaded); the output's
``loss`` is the language-model loss of the labels."""
import torch
from transformers import LlamaConfig, LlamaForCausalLM

config = LlamaConfig(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, use_cache=False,
)


def build():
    model = LlamaForCausalLM(config)
    ids = torch.randint(0, config.vocab_size, (1, 12))
    return model, {"input_ids": ids, "labels": ids}


def loss_fn(output):
    return output.loss
