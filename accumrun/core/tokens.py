"""The one convention of token ids that the tokenizers (which import no TensorFlow) and the losses, the step and
the models share: id 0 pads, and padding is no token: models mask it, losses skip it, and nothing predicts it."""

PADDING_ID = 0
