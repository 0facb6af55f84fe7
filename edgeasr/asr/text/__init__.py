"""The text rules: what a decoded window keeps. Its tokens cut into timestamped pieces (pieces),
those closed by a believable timestamp kept and where the next window starts (kept_pieces),
text over silence judged by the VAD (spoken), words read twice across a window seam (seams),
word timestamps and closing words with no audio under them (window_words), and a transcript's
final tidying (cleanup)."""
