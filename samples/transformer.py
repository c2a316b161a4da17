"""A small transformer encoder (nn.TransformerEncoder) over token embeddings.

    gradscope render samples/transformer.py -o transformer.svg
"""

import torch
from torch import nn

torch.manual_seed(0)


class TinyEncoder(nn.Module):
    def __init__(self, vocab: int = 50, d_model: int = 32, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, heads, dim_feedforward=64, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)))


model = TinyEncoder()
example_input = torch.randint(0, 50, (2, 8))
example_target = torch.randint(0, 50, (2, 8))


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


def batches():
    g = torch.Generator().manual_seed(1)
    while True:
        tokens = torch.randint(0, 50, (8, 8), generator=g)
        yield tokens, tokens.roll(1, dims=1)
