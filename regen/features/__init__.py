"""Stage 7: the target's hidden states ("features") for offline draft training, captured as a
prefill over the token ids the dataset already stores, one feature shard per dataset shard.

`layers` says which layers a convention captures and the flags that ask SGLang for them;
`site` is the capture module's launch (the server writes each request's tensors to a file);
`capture` is the client of one request; `encode` rounds to bf16 or fp8 and writes a sample;
`shard` captures and commits one shard; `stage` the whole stage; `sizes` what it will cost.
"""
