"""A Hugging Face T5 (encoder-decoder) from a small config (random weights, nothing
downloaded); the output's ``loss`` is the decoder's loss on the labels."""
import torch
from transformers import T5Config, T5ForConditionalGeneration

config = T5Config(
    vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
    num_heads=4, decoder_start_token_id=0, pad_token_id=0, use_cache=False,
)


def build():
    model = T5ForConditionalGeneration(config)
    return model, {"input_ids": torch.randint(1, 128, (1, 10)),
                   "labels": torch.randint(1, 128, (1, 6))}


def loss_fn(output):
    return output.loss
