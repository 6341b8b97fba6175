"""The agent side: the loop and the tool executor; plain classes, no HTTP, no model wire."""
