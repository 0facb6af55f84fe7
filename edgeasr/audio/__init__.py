"""Audio in: the microphone, files and stdin, the stream clock, and the VAD segmenter."""
