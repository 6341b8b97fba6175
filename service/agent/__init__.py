"""The agent side: the loop, the stream parsers and the tool executor; plain classes, no HTTP."""
