"""pytorch/examples' MNIST network and training loop, ported to treadle.

    python examples/mnist_port.py [--epochs 2] [--batch-size 64] [--lr 1.0] [--gamma 0.7]

The model class is torch's own, line for line: only the imports changed (`torch.flatten` is
`tl.flatten`). The training loop is the part that changes: `optimizer.zero_grad(); loss.backward();
optimizer.step()` becomes one `trainer.step(data, target)`, a compiled forward + backward + Adadelta
update that runs on the calling thread. The data are synthetic 28x28 "digits" (ten smooth templates,
shifted and noised per sample), so the example runs anywhere without a download; swap in the real
MNIST arrays (N, 1, 28, 28) float32 and int64 labels to train on them.
"""
import argparse

import numpy as np

import treadle as tl
import treadle.functional as F
import treadle.nn as nn
import treadle.optim as optim
from treadle.optim.lr_scheduler import StepLR


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = tl.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


# ---- data: synthetic digits, batches as numpy arrays ---------------------------------------------
def synthetic_digits(n, seed):
    """n images (n, 1, 28, 28) float32 normalised like MNIST, and int64 labels: one smooth random
    template per class, shifted by up to 2 pixels and noised per sample."""
    templates = np.random.default_rng(1234).standard_normal((10, 32, 32))
    for _ in range(4):  # smooth the templates so that shifted copies stay alike
        templates = (templates + np.roll(templates, 1, 1) + np.roll(templates, 1, 2)) / 3
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n)
    dy, dx = rng.integers(0, 5, n), rng.integers(0, 5, n)
    images = np.stack([templates[c, y:y + 28, x:x + 28] for c, y, x in zip(labels, dy, dx)])
    images = (images - images.mean()) / images.std() + 0.5 * rng.standard_normal(images.shape)
    return images[:, None].astype(np.float32), labels.astype(np.int64)


def batches(images, labels, batch_size, rng=None):
    order = np.arange(len(labels)) if rng is None else rng.permutation(len(labels))
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        yield images[idx], labels[idx]


# ---- the training loop: the lines that change ----------------------------------------------------
def train(args, trainer, data, epoch, rng):
    for batch_idx, (x, target) in enumerate(batches(*data, args.batch_size, rng)):
        loss = trainer.step(x, target)  # torch: zero_grad(); nll_loss(model(x), target).backward(); step()
        if batch_idx % args.log_interval == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * args.batch_size}/{len(data[1])}]\tLoss: {loss:.6f}")


def test(model, data, batch_size):
    model.eval()
    test_loss, correct = 0.0, 0
    for x, target in batches(*data, batch_size):
        output = model(x)  # eval mode: inference on numpy arrays, through the cached plan
        test_loss += -output[np.arange(len(target)), target].sum()
        correct += int((output.argmax(axis=1) == target).sum())
    model.train()
    n = len(data[1])
    print(f"\nTest set: Average loss: {test_loss / n:.4f}, Accuracy: {correct}/{n} ({100.0 * correct / n:.0f}%)\n")
    return test_loss / n, correct / n


def main(argv=None):
    parser = argparse.ArgumentParser(description="treadle MNIST port")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--test-batch-size", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--train-size", type=int, default=2048)
    parser.add_argument("--test-size", type=int, default=512)
    parser.add_argument("--log-interval", type=int, default=10)
    args = parser.parse_args(argv)

    tl.manual_seed(args.seed)
    train_data = synthetic_digits(args.train_size, args.seed)
    test_data = synthetic_digits(args.test_size, args.seed + 1000)
    model = Net()
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    trainer = tl.Trainer(model, F.nll_loss, optimizer)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    rng = np.random.default_rng(args.seed)
    result = None
    for epoch in range(1, args.epochs + 1):
        train(args, trainer, train_data, epoch, rng)
        result = test(model, test_data, args.test_batch_size)
        scheduler.step()
    print(f"final: test loss {result[0]:.4f}, accuracy {result[1]:.3f}")
    return result


if __name__ == "__main__":
    main()
