"""The 12 Hz speech tokenizer (codec): 24 kHz audio <-> 16 codes per 80 ms frame.

- ``quantization``: the split residual vector quantiser, both ways (codebook tables, dequantise, nearest code)
- ``decoder``: codes -> waveform (dequantise, pre-conv, sliding-window transformer, upsampling, SnakeBeta stack)
- ``encoder``: waveform -> codes (SEANet convolutions, transformer, downsampling, split RVQ)
- ``speech_tokenizer``: ``SpeechTokenizer`` (the checkpoint, decode, streaming decode, encode) and ``DecodeStream``
"""
