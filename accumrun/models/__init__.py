"""Models from the config: each kind registered once with its section and its build (:mod:`.registry`): the
built-ins, Keras applications, KerasHub backbones, saved models and ``package.module:function`` factories; the
input preprocessing in front of them (:mod:`.preprocessing`), logits or probabilities at their output
(:mod:`.outputs`), and the trained model saved as ``model.keras`` (:mod:`.saving`)."""
