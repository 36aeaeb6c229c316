"""Code openings the tests feed the random pairs."""

PROMPTS = [
    "def fib(n):",
    "import os\nfor name in os.listdir('.'):\n",
    "class Stack:\n    def push(self, item):",
    "x = [i * i for i in range(10)]\nprint(",
]
