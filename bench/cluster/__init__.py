"""Where workers run: ``torchrun`` (one machine or a real cluster), ``emulated`` (on
``netns``); ``perfmodel`` and ``projection`` model a step's communication."""
