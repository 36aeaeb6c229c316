"""The trainers: the shared skeleton (`common`), the draft recipe (`train_draft`), the small target
(`train_target`), their training text (`corpus`, `chat_prompts`), model cards, random models."""
