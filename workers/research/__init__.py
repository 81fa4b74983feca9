"""Research code: experiments a benchmark runs, not part of the serving path (nothing in workers' product
modules, the server or the SDK imports it). lora/: multi-LoRA KV sharing (`ragkv bench lora`)."""
