"""Twenty varied chat prompts for the lossless (token-identical) test."""

LOSSLESS_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "Explain what a hash table is in two sentences.",
    "List three prime numbers greater than 50.",
    "Translate 'good morning, how are you?' into Spanish.",
    "Write a Python function that reverses a string.",
    "What is 17 multiplied by 23?",
    "Give me a short tip for staying focused while studying.",
    "Summarise the plot of Romeo and Juliet in one sentence.",
    "What does HTTP stand for?",
    "Name the planets of the solar system in order.",
    "Write a SQL query that counts rows in a table named orders.",
    "Why is the sky blue? Answer briefly.",
    "Suggest a name for a coffee shop that sells books.",
    "What is the boiling point of water at sea level in Fahrenheit?",
    "Describe a cat to someone who has never seen one.",
    "Convert 5 kilometres to miles.",
    "Write the first line of a mystery novel.",
    "What are the three states of matter?",
    "Give an example of a metaphor.",
]
