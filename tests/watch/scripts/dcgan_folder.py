"""The shape of the DCGAN example of PyTorch's examples repository (``dcgan/main.py``): module-level code, an
``ImageFolder`` with a deterministic recipe (Resize, CenterCrop, ToTensor, Normalize), ``num_workers=int(opt.workers)``,
a discriminator and a generator step per batch.

Usage: python dcgan_folder.py --dataroot DIR [--workers N] [--batchSize B] [--imageSize S] [--niter E]

Prints ``step K loss L`` (the discriminator's) per batch and ``batches seen N`` at the end.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.optim as optim
import torch.utils.data
import torchvision.datasets as dset
import torchvision.transforms as transforms

parser = argparse.ArgumentParser()
parser.add_argument("--dataroot", required=True, help="path to dataset")
parser.add_argument("--workers", type=int, help="number of data loading workers", default=2)
parser.add_argument("--batchSize", type=int, default=16, help="input batch size")
parser.add_argument("--imageSize", type=int, default=32, help="the height / width of the input image to network")
parser.add_argument("--nz", type=int, default=8, help="size of the latent z vector")
parser.add_argument("--niter", type=int, default=2, help="number of epochs to train for")
opt = parser.parse_args()
torch.manual_seed(999)

dataset = dset.ImageFolder(
    root=opt.dataroot,
    transform=transforms.Compose(
        [
            transforms.Resize(opt.imageSize),
            transforms.CenterCrop(opt.imageSize),
            transforms.ToTensor(),
            transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
        ]
    ),
)
dataloader = torch.utils.data.DataLoader(dataset, batch_size=opt.batchSize, shuffle=True, num_workers=int(opt.workers))

s = opt.imageSize
netG = nn.Sequential(nn.Linear(opt.nz, 3 * s * s), nn.Tanh(), nn.Unflatten(1, (3, s, s)))
netD = nn.Sequential(nn.Conv2d(3, 4, 4, stride=4), nn.LeakyReLU(0.2), nn.Flatten(), nn.LazyLinear(1))
netD(torch.zeros(1, 3, s, s))  # materialise the lazy layer before the optimiser sees it
criterion = nn.BCEWithLogitsLoss()
optimizerD = optim.Adam(netD.parameters(), lr=0.0002, betas=(0.5, 0.999))
optimizerG = optim.Adam(netG.parameters(), lr=0.0002, betas=(0.5, 0.999))

seen = 0
for epoch in range(opt.niter):  # noqa: B007 - as the example writes its loops
    for i, data in enumerate(dataloader, 0):  # noqa: B007
        real = data[0]
        batch_size = real.size(0)
        netD.zero_grad()
        errD_real = criterion(netD(real).view(-1), torch.ones(batch_size))
        fake = netG(torch.randn(batch_size, opt.nz))
        errD_fake = criterion(netD(fake.detach()).view(-1), torch.zeros(batch_size))
        (errD_real + errD_fake).backward()
        optimizerD.step()
        netG.zero_grad()
        errG = criterion(netD(fake).view(-1), torch.ones(batch_size))
        errG.backward()
        optimizerG.step()
        print(f"step {seen} loss {(errD_real + errD_fake).item():.6f}", flush=True)
        seen += 1
print(f"batches seen {seen}", flush=True)
