"""The command reading: a final window heard with the home's vocabulary, read as the home's
command it says. What the decoder makes of the names (vocabulary: the prompt, the keyterms and
the margins), the search held to the home's sentences (grammar), whether a sentence could have
been heard as the text (mishearing), and the reading itself (reader)."""
