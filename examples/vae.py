"""A variational autoencoder in one module: noise drawn inside the forward, a custom loss with the KL term.

    python examples/vae.py [--steps 1500] [--seed 0]

The data are 16-dimensional observations of a 2-dimensional latent state (a smooth nonlinear map
plus noise), as a simulation's snapshots often are. The encoder gives the mean and log-variance of
the latent state, the forward samples it with `tl.functional.randn_like` (drawn from the trainer's
counter-based RNG: new every step, the same for a seed), and the decoder maps it back. The loss, a
plain function of the model's three outputs and the target, is traced into the training plan once,
so each `trainer.step` is a single planned call: forward, noise, loss, backward and the update.
"""
import argparse

import numpy as np

import treadle as tl
import treadle.functional as F

OBS, LATENT, WIDTH, NOISE = 16, 2, 64, 0.05


class VAE(tl.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = tl.nn.Linear(OBS, WIDTH)
        self.mu = tl.nn.Linear(WIDTH, LATENT)
        self.logvar = tl.nn.Linear(WIDTH, LATENT)
        self.dec1 = tl.nn.Linear(LATENT, WIDTH)
        self.dec2 = tl.nn.Linear(WIDTH, OBS)

    def forward(self, x):
        h = F.tanh(self.enc(x))
        mu, logvar = self.mu(h), self.logvar(h)
        # Training samples z (the reparameterisation: the gradient flows through mu and logvar);
        # inference (predict) decodes the mean.
        z = mu + (0.5 * logvar).exp() * F.randn_like(mu) if x.training else mu
        return self.dec2(F.tanh(self.dec1(z))), mu, logvar


def vae_loss(outputs, x):
    """The negative evidence lower bound per sample: Gaussian reconstruction term + KL(q(z|x) || N(0, I))."""
    recon, mu, logvar = outputs
    reconstruction = ((recon - x) ** 2).sum() / (2 * NOISE ** 2)
    kl = -0.5 * (1 + logvar - mu ** 2 - logvar.exp()).sum()
    return (reconstruction + kl) / x.size(0)


def observations(rng, n, mixing):
    z = rng.standard_normal((n, LATENT))
    return np.tanh(z @ mixing[:LATENT] + 0.5 * np.sin(z[:, :1] * z[:, 1:]) * mixing[LATENT]) \
        + NOISE * rng.standard_normal((n, OBS))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    tl.manual_seed(args.seed)
    mixing = rng.standard_normal((LATENT + 1, OBS)) / np.sqrt(LATENT)
    train = observations(rng, 4096, mixing).astype(np.float32)
    held_out = observations(rng, 1024, mixing).astype(np.float32)

    vae = VAE()
    trainer = tl.Trainer(vae, vae_loss, tl.optim.Adam(lr=2e-3), seed=args.seed)
    for step in range(args.steps):
        batch = train[rng.integers(0, len(train), 128)]
        loss = trainer.step(batch, batch)
        if step % 250 == 0 or step == args.steps - 1:
            print(f"step {step:5d}  loss (negative ELBO per sample) {loss:10.3f}")

    vae.eval()
    recon, mu, logvar = vae(held_out)
    relative = float(np.mean((recon - held_out) ** 2) / np.var(held_out))
    print(f"held-out reconstruction error relative to the data variance: {relative:.4f}")
    spread = ", ".join(f"{s:.3f}" for s in np.std(mu, axis=0))
    print(f"held-out latent means: std per dim {spread}; mean posterior variance {float(np.exp(logvar).mean()):.4f}")


if __name__ == "__main__":
    main()
