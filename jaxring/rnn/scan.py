"""The reference recurrent layer: D directions side by side over time, one jax.lax.scan.

The persistent layer (layer.py) computes the same thing by another split; its host
mirror and kernels are tested against this scan.
"""

import jax
import jax.numpy as jnp


def clipped_relu(x, clip: float):
    return jnp.clip(x, 0, clip)


def scan_recurrence(cell_name: str, relu_clip: float, unroll: int, kernels, biases, projected, mask):
    """The layer as one jax.lax.scan over time, computed in the inputs' dtype: [D, B, T, H], zero on padding.

    `cell_name`: "gru" or "rnn" (a ReLU clipped at `relu_clip`); kernels [D, H, gates * H],
    biases [D, gates * H], projected [D, B, T, gates * H] (the inputs' projections), mask
    [D, B, T]; each direction's frames in the order it reads them. The state is held across
    padded frames, so a direction reading time backwards starts at each utterance's own last
    frame. One loop for both directions halves the loop iterations: at ds2_tiny's size (batch
    16, 96 frames, 128 units) forward and backward take 23 ms on a 2-core CPU instead of 28 ms
    for one loop per direction.
    """
    biases = biases[:, None, :]

    def recurrent_input(h):
        return jnp.einsum("dbh,dhk->dbk", h, kernels) + biases

    if cell_name == "gru":

        def cell(x_t, h):
            x_r, x_z, x_n = jnp.split(x_t, 3, axis=-1)
            h_r, h_z, h_n = jnp.split(recurrent_input(h), 3, axis=-1)
            reset = jax.nn.sigmoid(x_r + h_r)
            update = jax.nn.sigmoid(x_z + h_z)
            candidate = jnp.tanh(x_n + reset * h_n)
            return (1 - update) * candidate + update * h

    else:

        def cell(x_t, h):
            return clipped_relu(x_t + recurrent_input(h), relu_clip)

    def step(h, inputs):
        x_t, real = inputs
        h_next = cell(x_t, h)
        h = jnp.where(real[..., None], h_next, h)
        return h, jnp.where(real[..., None], h_next, 0)

    directions, batch = projected.shape[:2]
    h0 = jnp.zeros((directions, batch, kernels.shape[1]), projected.dtype)
    time_major = (jnp.moveaxis(projected, 2, 0), jnp.moveaxis(mask, 2, 0))
    _, outputs = jax.lax.scan(step, h0, time_major, unroll=unroll)
    return jnp.moveaxis(outputs, 0, 2)
