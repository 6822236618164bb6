"""Models from the config: the built-ins and ``package.module:function`` factories (:mod:`.builders`)."""
