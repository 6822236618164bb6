"""Models from the config: the built-ins, Keras applications, saved models and ``package.module:function``
factories (:mod:`.builders`), the input preprocessing in front of them (:mod:`.preprocessing`), logits or
probabilities at their output (:mod:`.outputs`), and the trained model saved as ``model.keras`` (:mod:`.saving`)."""
