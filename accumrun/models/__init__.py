"""Models from the config: the built-ins and ``package.module:function`` factories (:mod:`.builders`), and the
trained model saved as ``model.keras`` (:mod:`.saving`)."""
