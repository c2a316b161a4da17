"""A 64-layer transformer encoder (d_model 64): thousands of autograd nodes, 64 identical layers.

Too big to draw node by node: `gradscope render` folds the 64 layers into one box and, when the
graph is still too large, collapses it by module depth (it says how to expand).

    gradscope render samples/deep_encoder.py -o deep_encoder.svg
    gradscope render samples/deep_encoder.py --no-fold --depth 2 -o layers.svg
    gradscope render samples/deep_encoder.py -o deep_encoder.html
"""

import torch
from torch import nn

torch.manual_seed(0)

D_MODEL, LAYERS = 64, 64


class DeepEncoder(nn.Module):
    def __init__(self, vocab: int = 100, d_model: int = D_MODEL, layers: int = LAYERS) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, nhead=4, dim_feedforward=128, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)))


model = DeepEncoder()
example_input = torch.randint(0, 100, (2, 16))


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    return output.logsumexp(-1).mean()
